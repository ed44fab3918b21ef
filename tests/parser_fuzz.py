"""A seeded fuzzer of the server's body parsers (issue 29 item 1), shared by
tests/test_parser_fuzz.py (a few thousand cases, in the suite) and bench/fuzz_parsers.py (a million).

Each case is a body built from the names the parsers know (h3bridge's fields, vLLM-Omni's and
SGLang's markers, `extra_params` and `target` keys, `conditions` items, the fields h3 cannot honour)
and hostile values (integers of up to 6,000 digits, NaN, infinity, 1e999, control characters, long
text, nested arrays and objects, wrong types, data URLs), written as JSON text or as a form's text
fields, then run through what `POST /v1/videos` runs: parse_json_body, pairs_from_json,
dialects.translate, request_from_wire and GenerationRequest.validate (without opening files);
and every number through safeio.numbers. Anything raised that is not h3bridge's own error
(H3BridgeError) is a finding: counted, with the first few bodies kept to reproduce it.
"""
from __future__ import annotations

import json
import random
import shutil
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from h3bridge.errors import H3BridgeError
from h3bridge.safeio.numbers import read_float, read_int
from h3bridge.server import dialects
from h3bridge.wire import videos as wire
from h3bridge.server.uploads import UploadLimits, parse_json_body

_VLLM_EXTRA_KEYS = ("task", "duration", "frame_indices", "aspect_ratio", "short_edge", "flow_shift",
                    "audio_flow_shift", "start_time_seconds", "quality", "seed", "x")
_TARGET_KEYS = ("short_edge", "aspect_ratio", "duration_seconds", "fps")
_CONDITION_KEYS = ("type", "uri", "role", "frame_index", "start_time_seconds", "x")
NAMES = tuple(sorted(set(wire.field_names()) | dialects.VLLM_MARKERS | dialects.SGLANG_MARKERS | {
    "flow_shift", "quality", "negative_prompt", "guidance_scale", "num_outputs_per_prompt",
    "enable_frame_interpolation", "extra_body", "slower_paths[]", "input_reference[image_url]", "use_slower"}))
_PNG = "data:image/png;base64,iVBORw0KGgo="
_WORDS = ("t2va", "fl2va", "ref2va", "16:9", "9:16", "auto", "adaptive", "1:1", "lossless", "keyframe", "reference",
          "image", "video", "audio", "video_audio", "decoded_files", "true", "false", "96x64", "864x480", "bf16-mlp",
          "max", "match", "fast", "nan", "inf", "-inf", "Infinity", "1e999", "-0", "0x10", "1_000", "12.0", "3.0",
          "²:1", "١٢", "24.0", _PNG, "data:image/png;base64,@@@", "http://example/x.png", "/etc/passwd")


@dataclass(frozen=True)
class Digits:
    """An integer literal written as its digits (json.dumps refuses ints past 4,300 digits)."""

    text: str


def _digits(rng: random.Random) -> Digits:
    size = rng.choice((1, 2, 3, 5, 19, 20, 21, 40, 309, 310, 400, 4300, 4301, 5000, 6000))
    text = str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(min(size - 1, 40)))
    text += "0" * max(0, size - len(text))
    return Digits(("-" if rng.random() < 0.3 else "") + text)


def _text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.4:
        return rng.choice(_WORDS)
    if roll < 0.6:
        return rng.choice(("", "", "", "0" * 5000, "-" + "0" * 4400)) + _digits(rng).text.lstrip("-") + \
            rng.choice(("", "", ".0", ".5", "e5", "e999", "x480"))
    if roll < 0.75:
        return "".join(chr(rng.choice((0, 1, 9, 10, 13, 27, 127, 0x85, 0x2028, 0xFEFF, rng.randint(32, 0x2FFF))))
                       for _ in range(rng.randint(0, 12)))
    if roll < 0.78:
        return rng.choice("ab9\n") * rng.choice((1000, 100_000))
    return "".join(rng.choice("abcxyz019 .:-_") for _ in range(rng.randint(0, 10)))


def _scalar(rng: random.Random) -> object:
    roll = rng.random()
    if roll < 0.3:
        return _digits(rng)
    if roll < 0.4:
        return rng.choice((float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 12.0, 3.0, 0.5, 5.0, 4.0))
    if roll < 0.5:
        return rng.choice((True, False, None, 0, 1, -1, 12, 3, 24, 768, 2**63, 2**64))
    return _text(rng)


def _value(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if depth < 3 and roll < 0.12:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 3 and roll < 0.22:
        return {rng.choice(_VLLM_EXTRA_KEYS + _TARGET_KEYS + _CONDITION_KEYS): _value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    if roll < 0.24:
        return "[" * 3000 + "]" * 3000 if depth == 0 else []      # nesting json cannot read (as text)
    return _scalar(rng)


def _member(rng: random.Random) -> tuple[str, object]:
    name = rng.choice(NAMES) if rng.random() < 0.95 else _text(rng)
    if name == "extra_params" and rng.random() < 0.8:
        return name, {rng.choice(_VLLM_EXTRA_KEYS): _value(rng, 1) for _ in range(rng.randint(1, 3))}
    if name == "target" and rng.random() < 0.8:
        return name, {rng.choice(_TARGET_KEYS): _value(rng, 1) for _ in range(rng.randint(1, 3))}
    if name == "conditions" and rng.random() < 0.8:
        return name, [{key: (_value(rng, 2) if rng.random() < 0.5 else
                             {"type": "image", "uri": _PNG, "role": rng.choice(("keyframe", "reference"))}.get(key, 0))
                       for key in rng.sample(_CONDITION_KEYS, rng.randint(1, 5))} for _ in range(rng.randint(1, 2))]
    return name, _value(rng)


def body(rng: random.Random) -> list[tuple[str, object]]:
    """One body's members, in order (a name may repeat)."""
    members = [_member(rng) for _ in range(rng.randint(0, 6))]
    if rng.random() < 0.8:
        members.insert(0, ("prompt", "a fox"))
    return members


def to_json_text(value: object) -> str:
    """JSON text of a generated value (Digits as their literal; NaN and infinities as Python's json writes them)."""
    if isinstance(value, Digits):
        return value.text
    if isinstance(value, str) and value.startswith("[[["):
        return value                           # nesting written as text on purpose
    if isinstance(value, list):
        return "[" + ",".join(to_json_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json_text(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def to_form_pairs(members: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """The members as a multipart form's text fields: scalars as text, objects and lists as JSON text
    (vLLM-Omni's form sends extra_params so)."""
    pairs: list[tuple[str, object]] = []
    for name, value in members:
        if isinstance(value, Digits):
            pairs.append((name, value.text))
        elif isinstance(value, bool):
            pairs.append((name, "true" if value else "false"))
        elif isinstance(value, (list, dict)):
            pairs.append((name, to_json_text(value)))
        elif value is not None:
            pairs.append((name, str(value)))
    return pairs


@dataclass
class FuzzCounts:
    cases: int = 0
    accepted: int = 0
    refused: int = 0                       # h3bridge's own error (RequestError and family)
    foreign: Counter = field(default_factory=Counter)     # (where, exception type) -> count
    examples: list[str] = field(default_factory=list)       # the first few foreign cases, to reproduce
    numbers: int = 0                       # values read by safeio.numbers directly

    @property
    def foreign_total(self) -> int:
        return sum(self.foreign.values())

    def summary(self) -> str:
        lines = [f"cases {self.cases:,}: accepted {self.accepted:,}, refused with h3bridge's own error "
                 f"{self.refused:,}, other errors {self.foreign_total:,}; numbers read directly {self.numbers:,}"]
        lines += [f"  {where}: {kind} x{count}" for (where, kind), count in self.foreign.most_common()]
        return "\n".join(lines)


def _parse(members: list[tuple[str, object]], as_form: bool) -> list[tuple[str, object]]:
    if as_form:
        return to_form_pairs(members)
    text = "{" + ",".join(f"{json.dumps(name)}:{to_json_text(value)}" for name, value in members) + "}"
    return wire.pairs_from_json(parse_json_body(text.encode("utf-8")))


def run_case(rng: random.Random, inputs: Path, limits: UploadLimits, counts: FuzzCounts) -> None:
    members = body(rng)
    as_form = rng.random() < 0.35
    stage = "parse"
    counts.cases += 1
    try:
        pairs = _parse(members, as_form)
        stage = "translate"
        translated = dialects.translate(pairs, [], inputs, limits)
        stage = "request_from_wire"
        request, _ = wire.request_from_wire(translated.pairs, translated.uploads)
        stage = "validate"
        request.validate(check_files=False)
        counts.accepted += 1
    except H3BridgeError:
        counts.refused += 1
    except Exception as error:       # a finding: anything not ours
        counts.foreign[(stage, type(error).__name__)] += 1
        if len(counts.examples) < 5:
            counts.examples.append(f"{'form' if as_form else 'json'} {members!r:.600}\n"
                                   + "".join(traceback.format_exception(error)[-3:]))
    finally:
        if inputs.exists():
            shutil.rmtree(inputs)
    # And one value straight into safeio.numbers, as every parser reads its numbers.
    value = _scalar(rng)
    value = value.text if isinstance(value, Digits) and rng.random() < 0.5 else \
        int(value.text) if isinstance(value, Digits) and len(value.text) < 4000 else value
    for read in (read_int, read_float):
        counts.numbers += 1
        try:
            read(value, field="f", minimum=-10, maximum=10)
        except H3BridgeError:
            pass
        except Exception as error:
            counts.foreign[(read.__name__, type(error).__name__)] += 1


def fuzz(cases: int, seed: int, workdir: Path) -> FuzzCounts:
    rng = random.Random(seed)
    counts = FuzzCounts()
    limits = UploadLimits()
    for _ in range(cases):
        run_case(rng, workdir / "inputs", limits, counts)
    return counts
