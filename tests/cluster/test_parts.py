"""The cluster's small parts: metrics merged across replicas, the shared state (default weights with a
version, stale replicas forgotten) and the settings (files, flags, checks, Serve options)."""

from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from engine.errors import ConfigError, EngineError
from studio.cluster.config import ClusterConfig
from studio.cluster.metrics import gauge, merge_expositions
from studio.cluster.routing import ModelSet
from studio.cluster.state import ClusterState, ReplicaReport
from tests.support.paths import REPO

REPLICA_TEXT = """# HELP sovits_requests_total HTTP requests answered.
# TYPE sovits_requests_total counter
sovits_requests_total{endpoint="/tts",status="200"} 3
# HELP sovits_latency_seconds Latency.
# TYPE sovits_latency_seconds histogram
sovits_latency_seconds_bucket{le="1"} 1
sovits_latency_seconds_bucket{le="+Inf"} 2
sovits_latency_seconds_sum 1.5
sovits_latency_seconds_count 2
# HELP sovits_queue Waiting.
# TYPE sovits_queue gauge
sovits_queue 0
"""


# ---- metrics -----------------------------------------------------------------------------------


def test_merged_metrics_label_every_sample_with_its_replica_and_keep_families_whole():
    text = merge_expositions({"r1": REPLICA_TEXT, "r2": REPLICA_TEXT.replace("} 3", "} 5")})
    lines = text.splitlines()
    assert lines.count("# TYPE sovits_requests_total counter") == 1
    assert 'sovits_requests_total{endpoint="/tts",status="200",replica="r1"} 3' in lines
    assert 'sovits_requests_total{endpoint="/tts",status="200",replica="r2"} 5' in lines
    assert 'sovits_latency_seconds_sum{replica="r2"} 1.5' in lines
    assert 'sovits_queue{replica="r1"} 0' in lines
    # every sample follows its own family's TYPE line (Prometheus requires families to be contiguous)
    family = None
    for line in lines:
        if line.startswith("# TYPE"):
            family = line.split()[2]
        elif not line.startswith("#"):
            assert line.startswith(family), (line, family)


def test_merging_nothing_gives_nothing_and_cluster_gauges_render():
    assert merge_expositions({}) == ""
    assert gauge("g", "help", [({}, 2), ({"a": 'x"y'}, 0.5)]).splitlines() == [
        "# HELP g help", "# TYPE g gauge", "g 2", 'g{a="x\\"y"} 0.5']


# ---- state -------------------------------------------------------------------------------------


def report(replica: str) -> ReplicaReport:
    return ReplicaReport(replica=replica, pid=1, node="n", host="h", device="cpu", model_sets=(), running=0,
                         queued=0, metrics="")


def test_default_weights_carry_a_version_that_moves_on_every_change():
    state = ClusterState(ModelSet("/a.ckpt", "/a.pth"))
    first = asyncio.run(state.defaults())
    second = asyncio.run(state.set_defaults(ModelSet("/b.ckpt", "/a.pth")))
    assert (second.epoch, second.generation) == (first.epoch, first.generation + 1)
    assert asyncio.run(state.defaults()).models == ModelSet("/b.ckpt", "/a.pth")
    restarted = ClusterState(ModelSet("/a.ckpt", "/a.pth"))
    assert asyncio.run(restarted.defaults()).epoch != first.epoch


def test_replicas_that_stop_reporting_are_forgotten():
    state = ClusterState(ModelSet("/a", "/b"), stale_after_s=0.2)
    asyncio.run(state.report(report("r2")))
    asyncio.run(state.report(report("r1")))
    assert [r.replica for r, _ in asyncio.run(state.replicas())] == ["r1", "r2"]
    time.sleep(0.3)
    asyncio.run(state.report(report("r1")))
    (live, age), = asyncio.run(state.replicas())
    assert live.replica == "r1" and 0 <= age < 0.2


def test_a_restarted_state_reads_the_default_weights_back_but_a_new_deployment_does_not(tmp_path):
    config_set, chosen = ModelSet("/a.ckpt", "/a.pth"), ModelSet.of(tmp_path / "b.ckpt", tmp_path / "b.pth")
    for path in (chosen.gpt, chosen.sovits):
        open(path, "wb").close()
    state_file = str(tmp_path / "voices" / ".cluster-app.json")  # the voices folder does not exist yet
    state = ClusterState(config_set, state_file=state_file, deployment="d1")
    asyncio.run(state.set_defaults(chosen))
    restarted = ClusterState(config_set, state_file=state_file, deployment="d1")
    assert asyncio.run(restarted.defaults()).models == chosen
    assert asyncio.run(restarted.defaults()).epoch != asyncio.run(state.defaults()).epoch  # replicas re-check
    redeployed = ClusterState(config_set, state_file=state_file, deployment="d2")
    assert asyncio.run(redeployed.defaults()).models == config_set  # as a restarted `serve`: the config's
    (tmp_path / "b.ckpt").unlink()
    gone = ClusterState(config_set, state_file=state_file, deployment="d1")
    assert asyncio.run(gone.defaults()).models == config_set  # saved weights that vanished are not used
    (tmp_path / "voices" / ".cluster-app.json").write_text("{not json")
    assert asyncio.run(ClusterState(config_set, state_file=state_file, deployment="d1").defaults()).models \
        == config_set


def test_a_new_replica_is_told_to_warm_the_defaults_then_the_sets_of_replicas_that_went_away():
    a, b, c = (ModelSet(f"/{x}.ckpt", f"/{x}.pth") for x in "abc")
    state = ClusterState(a, stale_after_s=0.2)
    assert asyncio.run(state.wanted_sets(2)) == [a.id]
    asyncio.run(state.report(ReplicaReport("r1", 1, "n", "h", "cpu", (a.id, b.id), 0, 0, "")))
    asyncio.run(state.report(ReplicaReport("r2", 2, "n", "h", "cpu", (c.id,), 0, 0, "")))
    assert asyncio.run(state.wanted_sets(3)) == [a.id]  # everyone is alive: nothing orphaned
    time.sleep(0.3)
    asyncio.run(state.report(ReplicaReport("r2", 2, "n", "h", "cpu", (c.id,), 0, 0, "")))
    assert asyncio.run(state.wanted_sets(3)) == [a.id, b.id]  # r1 went away holding a and b
    assert asyncio.run(state.wanted_sets(1)) == [a.id]


def test_a_replacement_started_before_the_dead_replica_counts_as_gone_warms_its_sets():
    """Serve may start the replacement of a killed replica within the dead one's staleness window: the sets
    that only silent replicas hold are wanted too (a set a reporting replica holds is not)."""
    a, b, c, d = (ModelSet(f"/{x}.ckpt", f"/{x}.pth") for x in "abcd")
    state = ClusterState(a, stale_after_s=60.0, late_after_s=0.2)
    asyncio.run(state.report(ReplicaReport("r1", 1, "n", "h", "cpu", (a.id, b.id, d.id), 0, 0, "")))
    asyncio.run(state.report(ReplicaReport("r2", 2, "n", "h", "cpu", (c.id, d.id), 0, 0, "")))
    assert asyncio.run(state.wanted_sets(4)) == [a.id]
    time.sleep(0.3)
    asyncio.run(state.report(ReplicaReport("r2", 2, "n", "h", "cpu", (c.id, d.id), 0, 0, "")))
    assert asyncio.run(state.wanted_sets(4)) == [a.id, b.id]  # r1 is silent; d is still held by r2
    assert len(asyncio.run(state.replicas())) == 2  # silent is not gone: /health still lists r1


# ---- settings ----------------------------------------------------------------------------------


def test_yaml_then_flags_with_paths_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("replicas: 3\nvoices_dir: shared/voices\nmax_model_sets: 4\n")
    config = ClusterConfig.load(tmp_path / "c.yaml", {"replicas": 2, "gpus_per_replica": None})
    assert (config.replicas, config.max_model_sets, config.gpus_per_replica) == (2, 4, 0.0)
    assert config.voices_dir == str(tmp_path / "shared" / "voices")
    assert config.reference_dirs == (str(tmp_path),)


@pytest.mark.parametrize("values, field", [
    ({"replicas": 0}, "replicas"), ({"gpus_per_replica": -1}, "gpus_per_replica"),
    ({"gpus_per_replica": 1.5}, "gpus_per_replica"), ({"min_replicas": 1}, "max_replicas"),
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas"), ({"max_model_sets": 0}, "max_model_sets"),
    ({"address": "auto", "num_cpus": 2}, "num_cpus"), ({"replica": 2}, "replica"),
    ({"device": "cuda"}, "gpus_per_replica"),
])
def test_bad_settings_are_refused_naming_the_setting(values, field):
    with pytest.raises(ConfigError, match=field):
        ClusterConfig.from_mapping(values)


def test_fixed_or_autoscaled_replicas_become_serve_options():
    fixed = ClusterConfig(replicas=3, gpus_per_replica=0.5).synthesizer_options()
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.5}
    scaled = ClusterConfig(min_replicas=0, max_replicas=4, target_ongoing_requests=3).synthesizer_options()
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 4, "initial_replicas": 1,
                                            "target_ongoing_requests": 3}


def test_the_shipped_configs_are_valid():
    """configs/cluster.yaml loads; the Serve config and the KubeRay manifest deploy our application
    builder with settings it accepts."""
    ClusterConfig.load(REPO / "configs" / "cluster.yaml")
    serve_config = yaml.safe_load((REPO / "configs" / "cluster-serve.yaml").read_text())
    (app,) = serve_config["applications"]
    assert app["import_path"] == "studio.cluster.app:build_app"
    ClusterConfig.from_mapping(app["args"])
    manifest = yaml.safe_load((REPO / "configs" / "kuberay-rayservice.yaml").read_text())
    assert manifest["kind"] == "RayService"
    (kube_app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    assert kube_app["import_path"] == app["import_path"]
    ClusterConfig.from_mapping(kube_app["args"])


def test_build_app_binds_gateway_replicas_and_state(tmp_path):
    pytest.importorskip("ray.serve", reason="the [cluster] extra (ray[serve]) is not installed")
    from studio.cluster.app import build_app

    infer = tmp_path / "tts_infer.yaml"
    infer.write_text(yaml.safe_dump({"custom": {"device": "cpu", "is_half": False, "version": "v2",
                                                "t2s_weights_path": "g.ckpt", "vits_weights_path": "s.pth",
                                                "bert_base_path": "bert", "cnhuhbert_base_path": "hubert"}}))
    app = build_app({"infer_config": str(infer), "replicas": 2, "voices_dir": str(tmp_path / "v")})
    assert type(app).__name__ == "Application"


def infer_yaml(path, **section) -> str:
    path.write_text(yaml.safe_dump({"custom": {
        "device": "cpu", "is_half": False, "version": "v2", "t2s_weights_path": "g.ckpt", "vits_weights_path": "s.pth",
        "bert_base_path": "bert", "cnhuhbert_base_path": "hubert", **section}}))
    return str(path)


def test_limits_and_knobs_come_from_the_tts_infer_yaml_as_for_serve(tmp_path):
    """No flag: the config's token cap and knobs, read by the same bootstrap functions as `serve`; the
    cluster's own settings (flags) win over them."""
    from studio.cli import build_parser
    from studio.cli.bootstrap import engine_settings, load_engine_config, token_cap, warmup_settings

    path = infer_yaml(tmp_path / "tts_infer.yaml", max_tokens_per_sentence=40, slots=3, warmup=False,
                      model_pool_mb=64)
    config = ClusterConfig.load(None, {"infer_config": path})
    assert config.server_settings().limits.max_tokens_per_sentence == 40
    serve_args = build_parser("serve").parse_args(["-c", path])
    engine = load_engine_config(path, required=True)
    assert config.server_settings().limits.max_tokens_per_sentence == token_cap(engine, serve_args)
    assert config.engine_settings() == engine_settings(engine, serve_args, weight_roots=config.weight_roots())
    assert config.engine_settings().scheduler_slots == 3 and config.engine_settings().model_pool_bytes == 64 << 20
    assert config.warmup_settings() == warmup_settings(engine, serve_args) and not config.warmup_settings().enabled
    flagged = ClusterConfig.load(None, {"infer_config": path, "max_tokens_per_sentence": 7,
                                        "knobs": {"slots": 5, "warmup": True}})
    assert flagged.server_settings().limits.max_tokens_per_sentence == 7
    assert flagged.engine_settings().scheduler_slots == 5 and flagged.warmup_settings().enabled
    with pytest.raises(ConfigError, match="slot"):
        ClusterConfig.from_mapping({"knobs": {"slot": 5}})


def test_the_command_line_reads_the_yaml_then_the_flags_then_finds_what_serve_finds(tmp_path, monkeypatch):
    from studio.cli import build_parser
    from studio.cli.cluster import config_from_args
    from studio.cli.serve import OFFICIAL_WEIGHT_DIRS

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tts_infer.yaml").write_text(yaml.safe_dump({"custom": {
        "device": "cpu", "is_half": False, "version": "v2", "t2s_weights_path": "w/g.ckpt",
        "vits_weights_path": "w/s.pth", "bert_base_path": "bert", "cnhuhbert_base_path": "hubert"}}))
    (tmp_path / "w").mkdir()
    for name in ("g.ckpt", "s.pth"):
        (tmp_path / "w" / name).write_bytes(b"x")
    (tmp_path / "configs" / "cluster.yaml").write_text("replicas: 3\nmax_model_sets: 5\nport: 9999\n"
                                                       "knobs: {slots: 2, model_pool_mb: 32}\n")
    args = build_parser("cluster").parse_args(["--replicas", "2", "--gpus-per-replica", "0.5", "--no-voice-uploads",
                                               "--slots", "4", "--no-warmup", "--no-dashboard"])
    config = config_from_args(args)
    assert dict(config.knobs) == {"slots": 4, "model_pool_mb": 32, "warmup": False}  # flags over the YAML
    assert config.dashboard is False and config.gateway_replicas == 2
    assert (config.replicas, config.max_model_sets, config.port) == (2, 5, 9999)  # flag beats the YAML
    assert config.gpus_per_replica == 0.5 and config.voice_uploads is False
    assert config.infer_config == str(tmp_path / "configs" / "tts_infer.yaml")  # found as `serve` finds it
    assert config.weight_dirs == tuple(str(tmp_path / d) for d in (*OFFICIAL_WEIGHT_DIRS, "w"))
    assert config.weight_roots() == config.weight_dirs


def test_without_ray_the_command_says_which_extra_to_install(monkeypatch):
    import sys

    from studio.cluster.launch import connect

    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray[serve] were not installed
    with pytest.raises(EngineError, match=r"\.\[cluster\]"):
        connect(ClusterConfig())


def test_the_command_warns_about_incomplete_default_weights_as_serve_does(tmp_path, monkeypatch, capsys):
    from studio.cli import build_parser
    from studio.cli import cluster as command
    from studio.cli.bootstrap import incomplete_weights_warning
    from studio.cluster import launch

    monkeypatch.chdir(tmp_path)
    path = infer_yaml(tmp_path / "tts_infer.yaml")  # names weights that are not there

    class Stop(Exception):
        pass

    def deploy(config, **_):
        raise Stop  # the warning comes before Ray starts

    monkeypatch.setattr(launch, "deploy", deploy)
    with pytest.raises(Stop):
        command.run(build_parser("cluster").parse_args(["-c", path]))
    err = capsys.readouterr().err
    from engine.config import load_config

    assert incomplete_weights_warning(load_config(path)) in err
    assert "the default weights are incomplete" in err and "t2s_weights_path" in err


def test_a_ray_started_here_is_a_new_one_with_its_dashboard_on_its_own_session_and_the_proxy_middleware(
        monkeypatch, tmp_path):
    """What `connect` asks of ray.init: never the Ray a `ray start` left running (address "local"), the
    dashboard on by default (ray[default] is installed with the extra), on a free port when 8265 is taken,
    the session folder and namespace given, and the proxy's middleware in the environment Ray inherits."""
    import socket

    pytest.importorskip("ray", reason="the [cluster] extra (ray[serve]) is not installed")
    import ray

    from studio.cluster import launch

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv(launch.PROXY_CALLBACK_ENV, raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started, url = launch.connect(ClusterConfig(dashboard_port=port, temp_dir=str(tmp_path), namespace="ns"))
    (kw,) = calls
    assert started and kw["address"] == "local" and kw["include_dashboard"] is True
    assert kw["dashboard_port"] != port and url == f"http://127.0.0.1:{kw['dashboard_port']}"
    assert kw["_temp_dir"] == str(tmp_path) and kw["namespace"] == "ns"
    assert launch.os.environ[launch.PROXY_CALLBACK_ENV] == launch.PROXY_CALLBACK
    calls.clear()
    assert launch.connect(ClusterConfig(dashboard=False)) == (True, None)
    assert calls[0]["include_dashboard"] is False and calls[0]["dashboard_port"] is None
