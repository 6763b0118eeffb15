"""``sovits-studio synth``: clone a voice from the command line and write a wav file.

Every sampling/mode option of :class:`engine.options.SynthesisOptions` is a flag with the same name
(``--top-k`` for ``top_k``) and the same default; the pipeline does the validation.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

_HIDDEN = {"streaming_mode"}  # exposed as --stream
FIT_MODES = ("error", "trim_pad")  # engine.reference.FIT_MODES (not imported here: -h stays fast)


def _option_fields():
    from engine.options import SynthesisOptions

    return [f for f in fields(SynthesisOptions) if f.name not in _HIDDEN]


_FLAGS = {"text": "--text", "text_lang": "--text-lang", "reference.audio": "--ref", "reference.text": "--ref-text",
          "reference.language": "--ref-lang", "out": "--out", "gpt": "--gpt", "sovits": "--sovits",
          "config": "--config"}


def flag_for(field: str) -> str | None:
    """The flag that sets the engine input ``field`` (an engine error's ``field``), or None."""
    if field.startswith("reference.aux_audio["):
        return f"--aux-ref #{int(field[len('reference.aux_audio['):-1]) + 1}"
    if field in _FLAGS:
        return _FLAGS[field]
    if any(f.name == field for f in _option_fields()):
        return "--" + field.replace("_", "-")
    return None


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text", required=True, help="text to read (or @FILE to read it from a file)")
    parser.add_argument("--text-lang", required=True, help="language of the text: zh, en, ja, ko, yue, auto, all_zh...")
    parser.add_argument("--ref", required=True, help="reference clip (3-10 s)")
    parser.add_argument("--ref-text", default=None,
                        help="transcript of the reference clip (required unless --ref-free)")
    parser.add_argument("--ref-lang", default="", help="language of the transcript (required with --ref-text)")
    parser.add_argument("--ref-free", action="store_true",
                        help="no transcript: reference-free mode (v1/v2/v2Pro* only; less faithful to the voice)")
    parser.add_argument("--ref-fit", default="error", choices=FIT_MODES,
                        help="a reference outside 3-10 s: error (official), or trim_pad (cut to 10 s / pad to 3 s)")
    parser.add_argument("--aux-ref", action="append", default=[], help="extra reference clip (repeatable)")
    parser.add_argument("--out", required=True, help="output wav file")
    from studio.cli.bootstrap import (
        add_config_argument,
        add_device_arguments,
        add_knob_arguments,
        add_verbose_argument,
    )

    add_config_argument(parser)
    add_device_arguments(parser)
    add_knob_arguments(parser)
    add_verbose_argument(parser)
    parser.add_argument("--gpt", default=None, help="GPT weights (.ckpt); default: from the config")
    parser.add_argument("--sovits", default=None, help="SoVITS weights (.pth); default: from the config")
    parser.add_argument("--t2s-decoder", default="auto", choices=("auto", "fast", "reference", "int8"),
                        help="T2S decoder: auto (CUDA graphs on CUDA), fast, reference, or int8 (CPU, reduced precision)")
    parser.add_argument("--stream", action="store_true",
                        help="token-chunk streaming (streaming_mode): write chunks to the file as they come")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    from engine.options import OPTION_HELP, SynthesisOptions

    defaults = SynthesisOptions()
    group = parser.add_argument_group("synthesis options (official TTS.run names and defaults)")
    for f in _option_fields():
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            kind = _bool
        elif f.name == "early_stop_num":
            kind = int
        elif isinstance(default, int):
            kind = int
        elif isinstance(default, float):
            kind = float
        else:
            kind = str
        group.add_argument(flag, dest=f.name, type=kind, default=None, metavar=f.name.upper(),
                           help=f"{OPTION_HELP[f.name]} (default: {default})")


def _options(args: argparse.Namespace):
    from engine.options import SynthesisOptions

    chosen = {f.name: getattr(args, f.name) for f in _option_fields() if getattr(args, f.name) is not None}
    if args.stream:
        chosen["streaming_mode"] = True
    return SynthesisOptions(**chosen)


class _Progress:
    """A one-line text progress bar on stderr (only for texts of several sentences)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < 2:
            return
        width = 30
        filled = int(width * done / total)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} sentences")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import soundfile as sf

    from engine.audio_formats import to_pcm16
    from engine.reference import Reference
    from studio.cli.bootstrap import build_studio, load_engine_config, quiet_libraries, token_cap

    quiet_libraries(args.verbose)
    # every input is checked here, before a model loads: a typo costs a second, not a model load
    text = _read_text(args.text)
    options = _options(args)
    config = load_engine_config(args.config, required=True)
    rules = _check_inputs(args, text, config)
    if options.early_stop_num is None and (cap := token_cap(config, args)):
        options = options.replace(early_stop_num=cap)  # the config's cap (test weight sets carry one)
    studio = build_studio(config, args, t2s_decoder=args.t2s_decoder, reference_rules=rules)
    reference = Reference(args.ref, "" if args.ref_free else args.ref_text, args.ref_lang, tuple(args.aux_ref))
    cloner = studio.cloner(gpt=args.gpt, sovits=args.sovits)
    progress = _Progress(not args.no_progress)
    sampler = _super_sampler(studio, cloner, options)
    results = ((r.sample_rate, r.audio, r.seed) for r in cloner(text, args.text_lang, reference, options,
                                                                  on_progress=progress))
    if sampler is not None:
        results = _super_sampled(results, sampler, whole=not args.stream)
    seconds, rate, chunks = 0.0, None, 0
    writer = None
    try:
        for sample_rate, audio, seed in results:
            if writer is None:
                rate = sample_rate
                writer = sf.SoundFile(args.out, "w", samplerate=rate, channels=1, subtype="PCM_16", format="WAV")
            writer.write(to_pcm16(audio))
            if args.stream:
                writer.flush()  # each chunk is on disk as soon as it is synthesised
            seconds += audio.shape[0] / sample_rate
            chunks += 1
    except BaseException:
        if writer is not None:  # a failed run leaves no half-written file behind
            writer.close()
            writer = None
            Path(args.out).unlink(missing_ok=True)
        raise
    finally:
        if writer is not None:
            writer.close()
    print(f"wrote {args.out}: {seconds:.2f} s at {rate} Hz ({chunks} chunk{'s' * (chunks != 1)}, seed {seed})")
    return 0


def _read_text(value: str) -> str:
    """``--text``, or the file that ``--text @FILE`` names."""
    from engine.errors import TextError

    if not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as fh:
            return fh.read()
    except OSError as e:
        raise TextError(f"cannot read the file {value[1:]} ({e.strerror})", field="text") from e
    except UnicodeDecodeError as e:
        raise TextError(f"the file {value[1:]} is not UTF-8 text", field="text") from e


def _check_inputs(args: argparse.Namespace, text: str, config):
    """Check the flags that name files, languages and the transcript; the reference rules they ask for.

    Raises engine errors whose ``field`` :func:`flag_for` maps to the flag to fix."""
    from pathlib import Path

    from engine.errors import CheckpointError, OptionsError, ReferenceAudioError, TextError, UnsupportedLanguageError
    from engine.reference import ReferenceRules, read_reference
    from engine.text.frontend import languages

    if not text.strip():
        raise TextError("text is empty: give something to read", field="text")
    out = Path(args.out)
    if out.is_dir():
        raise OptionsError(f"{out} is a folder; give the wav file to write, e.g. {out / 'out.wav'}", field="out")
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise OptionsError(f"the folder {folder} does not exist; create it first (mkdir -p {folder})", field="out")
    if not os.access(folder, os.W_OK):
        raise OptionsError(f"the folder {folder} is not writable", field="out")
    weights = (("gpt", args.gpt, "GPT weights (.ckpt)"), ("sovits", args.sovits, "SoVITS weights (.pth)"))
    for flag, path, kind in weights:
        if path and not Path(path).is_file():
            raise CheckpointError(f"{kind} {path} does not exist" if not Path(path).exists()
                                  else f"{kind} {path} is a folder; give the weight file", field=flag)
    # the configured version's languages; other weights (--gpt/--sovits) are checked again once loaded
    valid = languages(config.active.version if not (args.gpt or args.sovits) else "v2")
    if args.ref_free and args.ref_text:
        raise OptionsError("--ref-free reads no transcript: drop --ref-text, or drop --ref-free",
                           field="reference.text")
    if not args.ref_free and not (args.ref_text or "").strip():
        raise OptionsError("the reference clip's transcript is missing: give --ref-text \"what the clip says\" "
                           "and --ref-lang, or --ref-free for reference-free mode (v1/v2/v2Pro* only)",
                           field="reference.text")
    checks = [("text_lang", args.text_lang)]
    if not args.ref_free:
        if not args.ref_lang:
            raise UnsupportedLanguageError(f"the transcript's language is missing; use one of {', '.join(valid)}",
                                           field="reference.language")
        checks.append(("reference.language", args.ref_lang))
    for field, code in checks:
        if code not in valid:
            raise UnsupportedLanguageError(f"language {code!r} is not supported; use one of {', '.join(valid)}",
                                           field=field)
    rules = ReferenceRules(fit=args.ref_fit)
    for i, path in enumerate((args.ref, *args.aux_ref)):
        field = "reference.audio" if i == 0 else f"reference.aux_audio[{i - 1}]"
        try:
            read_reference(path, rules)
        except ReferenceAudioError as e:
            raise ReferenceAudioError(_cli_reference_message(e, path), field=field) from e
    return rules


def _cli_reference_message(error, path: str) -> str:
    """The engine's reference error, with the CLI's fix for a clip of the wrong length."""
    from engine.reference import ReferenceLengthError

    if isinstance(error, ReferenceLengthError):
        side = "too long" if error.seconds > error.max_seconds else "too short"
        return (f"{path} is {error.seconds:.2f} s long ({side}); references must be {error.min_seconds:g}-"
                f"{error.max_seconds:g} s. Pick another clip, or add --ref-fit trim_pad to cut it to "
                f"{error.max_seconds:g} s / pad it to {error.min_seconds:g} s")
    return str(error)


def _super_sampler(studio, cloner, options):
    """The v3 AP-BWE model when ``--super-sampling true`` can apply, else None (the reason printed, as the
    official code leaves the audio as it is)."""
    if not options.super_sampling:
        return None
    from engine.acoustic.super_sampling import SuperSamplerStore

    version = cloner.models.version
    if version != "v3":
        print(f"warning: --super-sampling applies to v3 models only, not {version}: ignored", file=sys.stderr)
        return None
    store = SuperSamplerStore.for_weights(studio.default_weights.base_dir, studio.runtime.device)
    sampler = store.get()
    if sampler is None:
        print(f"warning: --super-sampling needs the AP-BWE model at {store.path}: the audio keeps its 24 kHz",
              file=sys.stderr)
    return sampler


def _super_sampled(results, sampler, whole: bool):
    """``(rate, audio, seed)`` results raised to 48 kHz: the whole audio at once (official whole-file
    output), or each piece as it comes (official fragment output)."""
    import numpy as np

    if not whole:
        for rate, audio, seed in results:
            yield (*sampler(audio, rate)[::-1], seed)
        return
    pieces = list(results)
    if pieces:
        audio, rate = sampler(np.concatenate([a for _, a, _ in pieces]).astype(np.float32, copy=False), pieces[0][0])
        yield rate, audio, pieces[-1][2]
