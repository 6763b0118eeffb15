"""`sovits-studio bench` in CI-size mode reports every stage; its speed is not tested (figures go to docs)."""

from __future__ import annotations

import json

import pytest

from studio.cli import main


def test_tiny_bench_reports_every_field(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--tiny", "--random-weights", "v2", "--json", "--tokens", "12", "--batches", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["version"] == "v2" and report["device"] == "cpu" and "fp32" in report["precision"]
    stages = report["stages"]
    assert set(stages) == {"frontend", "ssl_reference", "t2s_batch1", "acoustic", "t2s_batch_throughput",
                           "end_to_end", "first_chunk_latency", "concurrent_streams"}
    for name in ("frontend", "ssl_reference", "t2s_batch1", "acoustic", "first_chunk_latency"):
        assert stages[name]["median_s"] > 0 and stages[name]["warmup_s"] > 0, name
    assert stages["t2s_batch1"]["tokens_per_s"] > 0 and stages["t2s_batch1"]["decoder"]
    assert set(stages["end_to_end"]) == {"short", "medium", "long"}
    assert all(r["audio_s"] > 0 and r["rtf"] > 0 for r in stages["end_to_end"].values())
    assert set(stages["t2s_batch_throughput"]) == {"2"}
    streams = stages["concurrent_streams"]
    assert set(streams) == {"1", "2"}
    for n, level in streams.items():
        assert level["requests"] == level["completed"] == int(n) and level["errors"] == {}
        fc, speed = level["first_chunk_s"], level["stream_speed"]
        assert 0 < fc["p50"] <= fc["p95"] <= fc["p99"] <= fc["max"]
        assert 0 < speed["min"] <= speed["p50"] <= speed["max"]
        assert level["audio_s"] > 0 and level["audio_s_per_s"] > 0
    assert report["memory"]["peak_rss_mb"] > 0
    assert report["workload"]["tokens"] == 12


def test_int8_decoder_choice(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--tiny", "--random-weights", "v1", "--json", "--tokens", "8", "--batches", "1",
                 "--t2s-decoder", "int8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stages"]["t2s_batch1"]["decoder"] == "T2SDecoder, int8 linears"
    assert report["stages"]["end_to_end"]["short"]["audio_s"] > 0
