"""transformers' "Loading weights" bars stay out of every command's output unless --verbose: the commands that
load models here (synth, serve, webui, bench) and in other processes (cluster replicas) quiet the libraries
first."""

from __future__ import annotations

import argparse
import sys

import pytest

from studio.cli import build_parser
from studio.cli import main as cli_main


@pytest.fixture
def bert_folder(tmp_path):
    from engine.testweights import make_test_weights

    config = make_test_weights(tmp_path / "set", "v2")
    from engine.config import load_config

    return load_config(config).path("bert_base_path")


@pytest.fixture
def bars_restored(monkeypatch):
    """Each test starts with the libraries' defaults (bars on) and leaves them so."""
    from transformers.utils import logging as hf_logging

    from engine.platform_env import HUB_BARS_VAR

    monkeypatch.delenv(HUB_BARS_VAR, raising=False)
    hf_logging.enable_progress_bar()
    yield
    hf_logging.enable_progress_bar()


def _load_bert(folder) -> None:
    from engine.text.bert import BertFeatureExtractor

    BertFeatureExtractor.from_folder(folder)


@pytest.mark.parametrize("verbose", [False, True])
def test_bench_loads_models_without_bars_unless_verbose(bert_folder, bars_restored, monkeypatch, capfd,
                                                        verbose) -> None:
    import studio.bench

    def run_benchmark(cfg, log):  # the workload's model loading, without the timing
        _load_bert(bert_folder)
        return {}

    monkeypatch.setattr(studio.bench, "run_benchmark", run_benchmark)
    monkeypatch.setattr(studio.bench, "format_report", lambda report: "report")
    capfd.readouterr()
    assert cli_main(["bench", "--tiny", *(["--verbose"] if verbose else [])]) == 0
    err = capfd.readouterr().err
    assert ("Loading weights" in err) == verbose, err[-2000:]


def test_a_cluster_replica_quiets_its_own_process(bert_folder, bars_restored, monkeypatch, capfd) -> None:
    """The cluster's driver quiets itself, and passes --verbose on to the replicas (processes of their own),
    which quiet themselves before loading."""
    from studio.cli import cluster as cluster_cli
    from studio.cluster import launch

    seen = []

    class Stop(Exception):
        pass

    def deploy(config):
        seen.append(config)
        raise Stop

    monkeypatch.setattr(launch, "deploy", deploy)
    for flags in ([], ["--verbose"]):
        with pytest.raises(Stop):
            cluster_cli.run(build_parser("cluster").parse_args(flags))
    assert [c.verbose for c in seen] == [False, True]
    # what a replica does first (Synthesizer.__init__), then its engine loads
    from engine.platform_env import quiet_libraries

    quiet_libraries(seen[0].verbose)
    capfd.readouterr()
    _load_bert(bert_folder)
    assert "Loading weights" not in capfd.readouterr().err
    quiet_libraries(seen[1].verbose)
    _load_bert(bert_folder)
    assert "Loading weights" in capfd.readouterr().err
    assert "verbose" in {a.dest for a in build_parser("cluster")._actions}
