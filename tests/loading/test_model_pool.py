"""ModelPool: LRU by bytes keyed by weight file, shared networks, allowed folders, and requests that
name their own weights without disturbing each other (RVC-Boss/GPT-SoVITS issue #1037)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import tests.support.synth as sup
from engine.errors import CheckpointError, OptionsError
from engine.loading.model_pool import ModelPool, WeightPathError, WeightSet, check_weight_path
from engine.runtime import resolve_runtime

CPU = resolve_runtime("cpu", "fp32")


class Net(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))  # 4 bytes per element


def fake_loaders(log: list):
    def t2s(path, rt, *extra):
        log.append(("t2s", path.name))
        return Net(100), 2700, torch.zeros(1025), None

    def sovits(path, rt, *extra):
        log.append(("sovits", path.name))
        return Net(100), "v2", 32000

    def shared(kind):
        def load(path, rt, *extra):
            log.append((kind, path.name))
            return Net(10)
        return load

    return {"t2s": t2s, "sovits": sovits, "ssl": shared("ssl"), "bert": shared("bert"),
            "vocoder": shared("vocoder"), "sv": shared("sv")}


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("a.ckpt", "b.ckpt", "c.ckpt", "a.pth", "b.pth", "c.pth"):
        (tmp_path / "weights" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "weights" / name).write_bytes(b"x")
        out[name] = tmp_path / "weights" / name
    for name in ("bert", "hubert"):
        (tmp_path / name).mkdir()
        out[name] = tmp_path / name
    (tmp_path / "elsewhere.ckpt").write_bytes(b"x")
    out["outside"] = tmp_path / "elsewhere.ckpt"
    return out


def weights(files, g: str, s: str) -> WeightSet:
    return WeightSet(gpt=files[g], sovits=files[s], bert=files["bert"], ssl=files["hubert"])


def test_sets_share_bert_and_hubert_and_hit_on_reuse(files):
    log = []
    pool = ModelPool(max_bytes=10_000, loaders=fake_loaders(log))
    m1 = pool.models(weights(files, "a.ckpt", "a.pth"), CPU)
    m2 = pool.models(weights(files, "b.ckpt", "a.pth"), CPU)
    assert m1.t2s is not m2.t2s and m1.sovits is m2.sovits and m1.bert is m2.bert and m1.ssl is m2.ssl
    assert [k for k, _ in log].count("bert") == 1 and [k for k, _ in log].count("sovits") == 1
    m3 = pool.models(weights(files, "a.ckpt", "a.pth"), CPU)
    assert m3.t2s is m1.t2s and pool.stats().loads == 5  # a, b GPT + sovits + bert + hubert
    assert m1.id != m2.id


def test_lru_eviction_by_bytes(files):
    log = []
    # 400 B per GPT/SoVITS, 40 B per shared net: one set is 880 B, a second GPT brings it to 1280 B
    pool = ModelPool(max_bytes=1000, loaders=fake_loaders(log))
    pool.models(weights(files, "a.ckpt", "a.pth"), CPU)
    assert pool.stats().evictions == 0
    pool.models(weights(files, "b.ckpt", "a.pth"), CPU)
    keys = pool.keys()
    assert any(k[:2] == ("t2s", str(files["b.ckpt"].resolve())) for k in keys)
    assert not any(k[:2] == ("t2s", str(files["a.ckpt"].resolve())) for k in keys)  # least recently used
    assert any(k[0] == "t2s" and k[1].endswith("b.ckpt") for k in keys)
    assert pool.stats().evictions == 1 and pool.nbytes <= 1000
    log.clear()
    pool.models(weights(files, "a.ckpt", "a.pth"), CPU)  # evicted: loaded again
    assert ("t2s", "a.ckpt") in log


def test_shrink_releases_bytes(files):
    pool = ModelPool(max_bytes=10_000, loaders=fake_loaders([]))
    pool.models(weights(files, "a.ckpt", "a.pth"), CPU)
    before = pool.nbytes
    freed = pool.shrink(0.5)
    assert freed > 0 and pool.nbytes == before - freed and pool.nbytes <= before / 2


def test_paths_outside_the_allowed_folders_are_refused(files):
    pool = ModelPool(weight_roots=(str(files["a.ckpt"].parent),), loaders=fake_loaders([]))
    w = weights(files, "a.ckpt", "a.pth")
    pool.models(w, CPU)
    for bad in (files["outside"], files["a.ckpt"].parent / ".." / "elsewhere.ckpt"):
        with pytest.raises(WeightPathError, match="GPT weights .*outside the allowed weight folders"):
            pool.models(w.replace(gpt=bad), CPU)
    with pytest.raises(WeightPathError, match="SoVITS weights.*does not exist"):
        pool.models(w.replace(sovits=files["a.ckpt"].parent / "missing.pth"), CPU)
    with pytest.raises(OptionsError):  # WeightPathError is both an OptionsError and a CheckpointError
        check_weight_path("", (), "gpt_weights_path")
    assert issubclass(WeightPathError, CheckpointError)


def test_symlink_escape_is_refused(files, tmp_path):
    link = files["a.ckpt"].parent / "link.ckpt"
    link.symlink_to(files["outside"])
    with pytest.raises(WeightPathError, match="outside"):
        check_weight_path(link, (str(files["a.ckpt"].parent),), "gpt_weights_path")


def test_failed_load_leaves_the_pool_unchanged(files):
    loaders = fake_loaders([])

    def broken(path, rt, *extra):
        raise CheckpointError(f"{path} is not a GPT file")

    loaders["t2s"] = broken
    pool = ModelPool(loaders=loaders)
    with pytest.raises(CheckpointError):
        pool.models(weights(files, "a.ckpt", "a.pth"), CPU)
    assert pool.stats().entries == 0 and pool.nbytes == 0


# ---- real tiny weights ----------------------------------------------------------------------


def test_two_users_with_different_gpt_weights_never_get_each_others_model(tmp_path):
    from engine.options import SynthesisOptions
    from engine.reference import Reference
    from engine.results import join
    from engine.testweights.t2s import write_t2s

    studio = sup.studio("v2")
    other_gpt = tmp_path / "other.ckpt"
    write_t2s(other_gpt, "v2", False, 7)  # same architecture, other random weights
    ref = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    opts = SynthesisOptions(seed=5, early_stop_num=12)
    text = "Good morning to you."

    def run(gpt):
        return join(studio.cloner(gpt=gpt)(text, "en", ref, opts))[1]

    alone = {None: run(None), "other": run(other_gpt)}
    assert not np.array_equal(alone[None], alone["other"])
    got: dict = {}

    def worker(name, gpt):
        got[name] = run(gpt)

    threads = [threading.Thread(target=worker, args=(n, other_gpt if n == "other" else None)) for n in alone]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in alone:
        np.testing.assert_array_equal(got[name], alone[name])
    # the configured default is untouched by a request that named other weights
    assert studio.cloner().models.weights.gpt == studio.default_weights.gpt


def test_set_default_weights_validates_before_switching(tmp_path):
    studio = sup.studio("v2")
    before = studio.default_weights
    with pytest.raises(CheckpointError):
        studio.set_default_weights(gpt=tmp_path / "nope.ckpt")
    assert studio.default_weights == before


@pytest.mark.parametrize("version", ["v2", "v2Pro", "v4"])
def test_warm_up_at_load(version, caplog):
    import logging

    from engine.options import EngineSettings
    from engine.studio import Studio

    shared = sup.studio(version)
    studio = Studio(shared.default_weights, shared.runtime, EngineSettings(warmup=True), pool=shared.pool)
    with caplog.at_level(logging.INFO, logger="engine.studio"):
        studio.cloner()
        studio.cloner()
    assert caplog.text.count("warmed up") == 1  # once per model set


def test_fast_t2s_decoder_through_the_pipeline():
    """EngineSettings(t2s_decoder="fast") runs FastT2S (here without CUDA graphs; streaming keeps the reference
    loop); seeded runs repeat."""
    from engine.options import EngineSettings, SynthesisOptions
    from engine.reference import Reference
    from engine.results import join
    from engine.studio import Studio

    shared = sup.studio("v2")
    studio = Studio(shared.default_weights, shared.runtime, EngineSettings(t2s_decoder="fast"))
    cloner = studio.cloner()
    assert cloner.models.t2s_fast is not None and shared.cloner().models.t2s_fast is None  # auto on CPU: reference
    ref = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    for opts in (SynthesisOptions(seed=2, early_stop_num=12, batch_size=2, text_split_method="cut5"),
                 SynthesisOptions(seed=2, early_stop_num=16, streaming_mode=True, min_chunk_length=4)):
        a = list(cloner("Good morning my friend. See you again soon.", "en", ref, opts))
        b = list(cloner("Good morning my friend. See you again soon.", "en", ref, opts))
        assert a[-1].is_last and [r.index for r in a] == list(range(len(a)))
        np.testing.assert_array_equal(join(a)[1], join(b)[1])


def test_coreml_vocoder_request_falls_back_to_torch_off_macos(caplog):
    import logging
    from dataclasses import replace

    from engine.options import SynthesisOptions
    from engine.reference import Reference
    from engine.studio import Studio

    shared = sup.studio("v4")
    weights = replace(shared.default_weights, vocoder_backend="coreml", vocoder_package="/nonexistent.mlpackage")
    studio = Studio(weights, shared.runtime, pool=shared.pool)
    with caplog.at_level(logging.WARNING, logger="engine.acoustic.vocoder_backend"):
        cloner = studio.cloner()
    assert isinstance(cloner.models.vocoder, torch.nn.Module) and "torch vocoder" in caplog.text
    ref = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    out = list(cloner("Nice to meet you.", "en", ref,
                      SynthesisOptions(seed=1, early_stop_num=12, sample_steps=2, parallel_infer=False)))
    assert out[-1].sample_rate == 48000
