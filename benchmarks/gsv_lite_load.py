"""gsv-tts-lite (PyPI ``gsv-tts-lite``, module ``gsv_tts``) on the same weights, texts and clips as
``product_load.py``, in process: its streaming API and its batch API at the same client counts. Writes one
JSON report whose levels have the shape of ``loadtest --mix``'s, or, when it cannot run, exactly why.

What its APIs are (gsv-tts-lite 0.4.7, read from its source):
- ``TTS.infer_stream(...)`` yields ``AudioClip`` chunks (``audio_data`` float32 at 32 kHz, ``audio_len_s``)
  for one text; its concurrent form ``infer_stream_async`` runs each stream under the engine's one lock
  (``TTS._infer_lock``), so concurrent streams run one after another. Here: N clients, closed loop, their
  streams run in arrival order on one worker thread (the same one-at-a-time order as the lock), and a stream
  whose turn comes more than ``--timeout`` s after it was asked for is counted as a timeout without running;
- ``TTS.infer_batched(spk_audio_paths, prompt_audio_paths, prompt_audio_texts, texts, text_languages,
  prompt_languages)`` returns one whole ``AudioClip`` per text, batching T2S rows (CUDA-graph buckets of
  ``gpt_cache`` (batch, kv length)) and SoVITS. Here: each call carries N texts with N clips (one per
  client), back to back for the level's duration; every clip's latency is the call's.

Its model folder (``models_dir``) is built from our model set: symbolic links to the GPT (``s1v3.ckpt``),
SoVITS (``s2Gv2ProPlus.pth``; it reads the official version header), HuBERT, RoBERTa and speaker-verification
files, plus its ``g2p`` text resources made from what this project ships (the opencpop pinyin table of
``engine/data``, CMUdict 0.7b of ``pronouncing``, g2p_en's checkpoint and homographs); nothing is downloaded.
Random weights never emit EOS, so every segment runs until its KV cache is full: ``--kv`` (default 512) bounds
prompt + text + generated tokens; the report gives the mean audio per request so runs can be compared.

    python3 benchmarks/gsv_lite_load.py --weights DIR/tts_infer.yaml --ref-dir ../shared/refset \\
        --levels 1,16 --duration 10 --out gsv.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.stream_stats import summarize  # noqa: E402
from studio.loadtest.mix import MixWorkload, load_mix  # noqa: E402
from studio.loadtest.run import StreamRecord, mix_figures  # noqa: E402

SAMPLE_RATE = 32000  # gsv-tts-lite's output rate (TTS.samplerate)


class Unavailable(Exception):
    """gsv-tts-lite cannot run here; the message says exactly why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True, help="the model set's tts_infer.yaml (make-test-weights)")
    ap.add_argument("--ref-dir", required=True, help="clips with a manifest.json, as loadtest --mix")
    ap.add_argument("--levels", default="1,16,64,256,1000")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=60.0, help="a stream not started this long after it "
                                                                "was asked for counts as a timeout")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--max-tokens", type=int, default=200, help="for the report only (see --kv)")
    ap.add_argument("--kv", type=int, default=512, help="gsv-tts-lite's KV cache length per row (gpt_cache)")
    ap.add_argument("--batch-rows", type=int, default=128, help="largest T2S batch bucket (gpt_cache)")
    ap.add_argument("--languages", default=None, help="comma-separated subset of the mix's (default: all)")
    ap.add_argument("--out", required=True, help="the JSON report")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; levels that would not fit are skipped")
    return ap.parse_args(argv)


# ---- the model folder -----------------------------------------------------------------------------


def _config_paths(weights: Path) -> dict[str, Path]:
    import yaml

    config = yaml.safe_load(weights.read_text(encoding="utf-8"))
    section = config.get("custom") or next(iter(config.values()))
    paths = {k: Path(section[k]) for k in ("t2s_weights_path", "vits_weights_path", "bert_base_path",
                                           "cnhuhbert_base_path")}
    paths["sv"] = paths["cnhuhbert_base_path"].parent / "sv" / "pretrained_eres2netv2w24s4ep4.ckpt"
    paths["version"] = section.get("version", "")
    return paths


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise Unavailable(f"{name} is not installed; its data files make gsv-tts-lite's g2p folder")
    return Path(spec.origin).parent


def build_models_dir(weights: Path, folder: Path) -> dict[str, str]:
    """gsv-tts-lite's models_dir from our model set; returns what each language's resources came from."""
    paths = _config_paths(weights)
    if paths["version"] != "v2ProPlus":
        raise Unavailable(f"the benchmark gives gsv-tts-lite its default SoVITS name s2Gv2ProPlus.pth; "
                          f"the weights are {paths['version']!r}")
    links = {"s1v3.ckpt": paths["t2s_weights_path"], "s2Gv2ProPlus.pth": paths["vits_weights_path"],
             "chinese-hubert-base": paths["cnhuhbert_base_path"],
             "chinese-roberta-wwm-ext-large": paths["bert_base_path"],
             "sv/pretrained_eres2netv2w24s4ep4.ckpt": paths["sv"]}
    for name, target in links.items():
        if not target.exists():
            raise Unavailable(f"{target} does not exist (gsv-tts-lite's {name})")
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(target.resolve())
    g2p = folder / "g2p"
    (g2p / "zh").mkdir(parents=True)
    constants = json.loads((ROOT / "engine" / "data" / "frontend_constants.json").read_text(encoding="utf-8"))
    table = next(v for k, v in constants.items() if k.startswith("GPT_SoVITS/text/opencpop-strict.txt"))
    (g2p / "zh" / "opencpop-strict.txt").write_text("".join(f"{p}\t{s}\n" for p, s in table.items()),
                                                    encoding="utf-8")
    en = g2p / "en"
    (en / "g2p_en").mkdir(parents=True)
    (en / "nltk").mkdir()
    try:
        # CMUdict 0.7b (56 comment lines, then "WORD  PHONES", as the official cmudict.rep it reads from line 57)
        cmu = (_package_dir("pronouncing") / "cmudict-0.7b").read_bytes().decode("latin-1")
        g2p_en = _package_dir("g2p_en")
    except Unavailable as e:
        english = f"none: {e}"
    else:
        (en / "cmudict.rep").write_text(cmu, encoding="utf-8")
        (en / "cmudict-fast.rep").write_text("", encoding="utf-8")  # the official's extra words: none here
        (en / "engdict-hot.rep").write_text("", encoding="utf-8")
        for name in ("checkpoint20.npz", "homographs.en"):
            (en / "g2p_en" / name).symlink_to(g2p_en / name)
        english = "CMUdict 0.7b of pronouncing (no cmudict-fast / hot words); g2p_en checkpoint and homographs"
    return {"zh": "opencpop table of engine/data/frontend_constants.json", "en": english,
            "ja": "pyopenjtalk with OPEN_JTALK_DICT_DIR (engine/text/openjtalk_dic)"}


# ---- the runs -------------------------------------------------------------------------------------


class Clips:
    """Client n's clip as a file of its own (the mix's bytes: unique per client), written once."""

    def __init__(self, mix: MixWorkload, folder: Path) -> None:
        self.mix, self.folder = mix, folder
        self.paths: dict[int, Path] = {}

    def get(self, serial: int) -> tuple[Path, str, str]:
        clip, data = self.mix.clip(serial)
        if serial not in self.paths:
            path = self.folder / f"client-{serial}.wav"
            path.write_bytes(data)
            self.paths[serial] = path
        return self.paths[serial], clip.text, clip.language


def clip_seconds(clip) -> float:
    """Seconds of audio in one AudioClip: its samples (a stream chunk's ``audio_len_s`` is the running total)."""
    return len(clip.audio_data) / clip.samplerate


def stream_level(tts, mix: MixWorkload, clips: Clips, clients: int, first_serial: int, duration: float,
                 timeout: float) -> list[StreamRecord]:
    """N clients, closed loop; streams run one at a time in arrival order (as under TTS._infer_lock)."""
    worker = ThreadPoolExecutor(max_workers=1)
    records: list[StreamRecord] = []
    sent = 0

    def one(job, serial: int, due: float) -> StreamRecord:
        if time.perf_counter() - due > timeout:
            return StreamRecord(None, None, time.perf_counter() - due, 0.0, None, "timeout",
                                f"not started within {timeout:g} s (streams run one at a time)", job.tag)
        path, prompt, prompt_lang = clips.get(serial)
        first, audio = None, 0.0
        try:
            for chunk in tts.infer_stream(spk_audio_path=str(path), prompt_audio_path=str(path),
                                          prompt_audio_text=prompt, text=job.text, text_language=job.text_lang,
                                          prompt_language=prompt_lang, debug=False):
                seconds = clip_seconds(chunk)
                if first is None and seconds > 0:
                    first = time.perf_counter() - due
                audio += seconds
        except Exception as e:  # noqa: BLE001 - one failed stream is a counted error, as over HTTP
            return StreamRecord(None, first, time.perf_counter() - due, audio, SAMPLE_RATE, "exception",
                                f"{type(e).__name__}: {e}"[:200], job.tag)
        return StreamRecord(200, first, time.perf_counter() - due, audio, SAMPLE_RATE, None, "", job.tag)

    async def client(serial: int, deadline: float) -> None:
        nonlocal sent
        loop = asyncio.get_running_loop()
        while time.perf_counter() < deadline:
            job = mix.job(sent)
            sent += 1
            records.append(await loop.run_in_executor(worker, one, job, serial, time.perf_counter()))

    async def level() -> None:
        deadline = time.perf_counter() + duration
        await asyncio.gather(*(client(first_serial + i, deadline) for i in range(clients)))

    try:
        asyncio.run(level())
    finally:
        worker.shutdown()
    return records


def batch_level(tts, mix: MixWorkload, clips: Clips, clients: int, first_serial: int,
                duration: float) -> list[StreamRecord]:
    """Calls of ``clients`` texts at once (client i's clip with text i), back to back for ``duration`` s."""
    records: list[StreamRecord] = []
    deadline = time.perf_counter() + duration
    n = 0
    while time.perf_counter() < deadline:
        jobs = [mix.job(n + i) for i in range(clients)]
        inputs = [clips.get(first_serial + i) for i in range(clients)]
        n += clients
        t0 = time.perf_counter()
        try:
            out = tts.infer_batched(spk_audio_paths=[str(p) for p, _, _ in inputs],
                                    prompt_audio_paths=[str(p) for p, _, _ in inputs],
                                    prompt_audio_texts=[t for _, t, _ in inputs], texts=[j.text for j in jobs],
                                    text_languages=[j.text_lang for j in jobs],
                                    prompt_languages=[lang for _, _, lang in inputs])
        except Exception as e:  # noqa: BLE001 - the whole call failed: each of its texts is an error
            wall = time.perf_counter() - t0
            records += [StreamRecord(None, None, wall, 0.0, None, "exception", f"{type(e).__name__}: {e}"[:200],
                                     j.tag) for j in jobs]
            break
        wall = time.perf_counter() - t0
        for job, clip in zip(jobs, out):
            records.append(StreamRecord(200, wall, wall, clip_seconds(clip), SAMPLE_RATE, None, "", job.tag))
    return records


def level_figures(clients: int, records: list[StreamRecord], wall: float) -> dict[str, Any]:
    level = {"clients": clients, **summarize((r.sample() for r in records), wall)}
    level.update(mix_figures(records, wall))
    level["error_messages"] = {r.error: r.message for r in reversed(records) if r.error and r.message}
    ok = [r.audio_s for r in records if r.error is None]
    level["mean_audio_s"] = round(sum(ok) / len(ok), 2) if ok else None
    return level


def run(args: argparse.Namespace, report: dict[str, Any], save) -> None:
    t_start = time.monotonic()
    dictionary = ROOT / "engine" / "text" / "openjtalk_dic"
    if "OPEN_JTALK_DICT_DIR" not in os.environ and dictionary.is_dir():
        os.environ["OPEN_JTALK_DICT_DIR"] = str(dictionary)  # pyopenjtalk reads it at import: no download
    try:
        import gsv_tts
    except Exception as e:  # noqa: BLE001 - ImportError, or a missing native library (OSError)
        raise Unavailable(f"gsv_tts (PyPI gsv-tts-lite) is not importable: {type(e).__name__}: {e}. It needs "
                          f"gsv-tts-lite and its dependencies (av, py3langid, pysbd, future, pyopenjtalk ...)") from None
    report["package"] = f"gsv-tts-lite {importlib.metadata.version('gsv-tts-lite')}"
    work = Path(tempfile.mkdtemp(prefix="gsv-lite-"))
    report["g2p_resources"] = build_models_dir(Path(args.weights), work / "models")
    dtype = "float16" if args.precision == "fp16" else "float32"
    use_bert = args.device != "cpu"  # on a CPU it wants an INT8 ONNX RoBERTa that only a download gives
    levels = [int(c) for c in args.levels.split(",") if c.strip()]
    rows = sorted({1, min(args.batch_rows, max(levels))})
    t = time.monotonic()
    tts = gsv_tts.TTS(models_dir=str(work / "models"), device=args.device, dtype=dtype, use_bert=use_bert,
                      gpt_cache=[(b, args.kv) for b in rows])
    report["how"] = (f"{report['package']}, device {args.device}, dtype {dtype}, use_bert={use_bert}, "
                     f"gpt_cache {[(b, args.kv) for b in rows]} (every segment runs to the KV length {args.kv}: "
                     f"random weights never stop), its default sampling (top_k 15) and text cutting")
    if not use_bert:
        report["notes"].append("Mandarin without BERT features (gsv-tts-lite's CPU path wants an INT8 ONNX "
                               "RoBERTa it downloads)")
    mix = load_mix(args.ref_dir, tuple(args.languages.split(",")) if args.languages else None)
    clips = Clips(mix, work / "clips")
    clips.folder.mkdir()
    # one call per language, alone: a language whose front end cannot run here is left out, with why
    excluded: dict[str, str] = {}
    for lang, text in mix.texts:
        clip = next((c for c in mix.clips if c.language == lang), mix.clips[0])
        path = clips.folder / f"warmup-{lang}.wav"  # the folder's own clip: no client uploads these bytes
        path.write_bytes(clip.wav)
        try:
            tts.infer(spk_audio_path=str(path), prompt_audio_path=str(path), prompt_audio_text=clip.text,
                      text=text, text_language=lang, prompt_language=clip.language)
        except Exception as e:  # noqa: BLE001 - recorded, the language is left out
            excluded[lang] = f"{type(e).__name__}: {e}"[:300]
    report["load_and_warmup_s"] = round(time.monotonic() - t, 1)
    report["excluded_languages"] = excluded
    keep = [lang for lang, _ in mix.texts if lang not in excluded]
    if not keep:
        by_reason: dict[str, list[str]] = {}
        for lang, why in excluded.items():
            by_reason.setdefault(why, []).append(lang)
        raise Unavailable("no language runs in gsv-tts-lite here: "
                          + "; ".join(f"{', '.join(langs)}: {why}" for why, langs in by_reason.items()))
    mix = MixWorkload(tuple(c for c in mix.clips if c.language in keep),
                      tuple((lang, text) for lang, text in mix.texts if lang in keep), (2,), mix.source)
    batch_mix = MixWorkload(mix.clips, mix.texts, (0,), mix.source)
    clips.mix = mix
    report["ran"] = True
    report["languages"] = keep
    save()
    serial = 0
    for api in ("batch", "stream"):  # the batch API first: its figures are the ones cited
        for clients in levels:
            cost = args.duration + (args.timeout if api == "stream" else args.duration)
            if time.monotonic() - t_start + cost > args.budget:
                report["notes"].append(f"{api} API: {clients} clients and up skipped (budget {args.budget:g} s)")
                break
            t0 = time.perf_counter()
            if api == "stream":
                records = stream_level(tts, mix, clips, clients, serial, args.duration, args.timeout)
            else:
                records = batch_level(tts, batch_mix, clips, clients, serial, args.duration)
            serial += clients
            report[api].append(level_figures(clients, records, time.perf_counter() - t0))
            lv = report[api][-1]
            print(f"gsv-tts-lite {api} API, {clients} clients: {lv['completed']}/{lv['requests']} ok, "
                  f"{lv['audio_s_per_s']:.1f} audio s/s, errors {lv['errors']}", flush=True)
            save()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report: dict[str, Any] = {"ran": False, "stream": [], "batch": [], "notes": []}
    out = Path(args.out)

    def save() -> None:
        out.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")

    try:
        run(args, report, save)
    except Unavailable as e:
        report["reason"] = str(e)
    except Exception as e:  # noqa: BLE001 - the parent prints the reason instead of failing
        report["reason"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()[-3000:]
    if not report["ran"] and "reason" not in report:
        report["reason"] = "it stopped before its first level"
    save()
    print(json.dumps({k: v for k, v in report.items() if k not in ("stream", "batch", "traceback")},
                     ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
