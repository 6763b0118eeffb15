"""Group commit (engine.batching.GroupRunner) and the batched BERT it serves: concurrent calls become
batches, each caller gets its own result (or its batch's error), a lone call runs alone, and BERT features
of texts batched with padding equal those of each text alone."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from engine.batching import GroupRunner
from engine.text.bert import BertFeatureExtractor


def test_a_lone_call_runs_alone() -> None:
    seen: list[list[int]] = []
    runner = GroupRunner(lambda items: (seen.append(list(items)), [x * 2 for x in items])[1])
    assert runner(21) == 42 and seen == [[21]] and (runner.batches, runner.items) == (1, 1)


def test_concurrent_calls_are_batched_and_each_gets_its_own_result() -> None:
    started = threading.Event()
    release = threading.Event()
    sizes: list[int] = []

    def run(items):
        sizes.append(len(items))
        if len(sizes) == 1:  # hold the first batch so the others queue behind it
            started.set()
            release.wait(10)
        return [x * x for x in items]

    runner = GroupRunner(run, max_batch=8)
    results: dict[int, int] = {}

    def call(x: int) -> None:
        results[x] = runner(x)

    first = threading.Thread(target=call, args=(1,))
    first.start()
    assert started.wait(10)
    others = [threading.Thread(target=call, args=(x,)) for x in range(2, 12)]
    for t in others:
        t.start()
    deadline = time.monotonic() + 10
    while len(runner._queue) < 10 and time.monotonic() < deadline:
        time.sleep(0.005)
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert results == {x: x * x for x in range(1, 12)}
    assert sizes[0] == 1 and sum(sizes) == 11 and max(sizes) == 8 and len(sizes) == 3  # 1, then 8 + 2


def test_an_error_reaches_every_caller_of_its_batch_only() -> None:
    def run(items):
        if "bad" in items:
            raise ValueError("bad item in batch")
        return list(items)

    runner = GroupRunner(run)
    with pytest.raises(ValueError, match="bad item"):
        runner("bad")
    assert runner("good") == "good"


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    from engine.testweights.roberta import write_roberta_folder

    folder = tmp_path_factory.mktemp("roberta")
    write_roberta_folder(folder, False)
    return folder


def test_batched_bert_features_equal_each_text_alone(bert_folder) -> None:
    alone = BertFeatureExtractor.from_folder(bert_folder)
    assert alone._group is None  # the CPU default: each text alone, as the official code
    batched = BertFeatureExtractor(alone.model, alone.tokenizer, batched=True)
    texts = ["你好", "今天天气很好我们出去走走吧", "这是一个测试句子", "好"]
    expected = [alone.char_features(t) for t in texts]
    got = batched._batch_features(texts)
    for e, g, t in zip(expected, got, texts):
        assert g.shape == (len(t), alone.hidden_size)
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    out: dict[str, torch.Tensor] = {}
    threads = [threading.Thread(target=lambda t=t: out.__setitem__(t, batched.char_features(t))) for t in texts]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    for e, t in zip(expected, texts):
        torch.testing.assert_close(out[t], e, rtol=1e-4, atol=1e-5)
    assert batched.batches[1] == len(texts)


def test_batches_run_on_the_given_executor_thread() -> None:
    from concurrent.futures import ThreadPoolExecutor

    names: list[str] = []
    pool = ThreadPoolExecutor(1, thread_name_prefix="device-owner")
    runner = GroupRunner(lambda items: (names.append(threading.current_thread().name), list(items))[1], executor=pool)
    results: list = []
    threads = [threading.Thread(target=lambda i=i: results.append(runner(i))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    pool.shutdown()
    assert sorted(results) == list(range(6)) and names and all(n.startswith("device-owner") for n in names)
