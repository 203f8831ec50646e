"""Check ``spec.engine.extraArgs`` the way ``vllm serve`` will parse them.

Why: the operator appends extraArgs to the command line it builds from the plan. A flag
that sets what the plan sets wins in vLLM (the last value counts), and the plan's memory
and latency math would no longer describe the pods; a flag vLLM does not have makes the
engine exit at start-up, so the pod crash-loops. Matching flag spellings is not enough:
vLLM's ``FlexibleArgumentParser`` reads ``--max_num_seqs`` as ``--max-num-seqs``, argparse
takes any unique prefix (``--max-num-seq``), short options (``-tp``, ``-pp``) and
``--flag=value``. So this module replays that parsing over a table of the real parser's
actions (``vllm_flags.json``, written by ``tests/engine/dump_vllm_flags.py``;
the operator image has no vLLM) and reports the dest each argument sets.

Replayed from vLLM's ``FlexibleArgumentParser.parse_args`` (vllm/utils/argparse_utils.py):
underscores to dashes in ``--long_names`` (up to the first ``.``), ``-O3``/``-O 3`` as
``--optimization-level``, dotted JSON arguments (``--compilation-config.mode 3``,
``-cc.mode=3``) as their base flag. From argparse (Python 3.11/3.12 rules): exact option
strings, ``--flag=value``, unique prefixes of ``--long`` options (an ambiguous one is an
error), a short option glued to its value (``-qawq``; ``-tp2`` is NOT ``-tp 2``: argparse
only splits after the first character), negative numbers as values, and how many values
each action consumes. Not replayed: ``--config FILE`` (refused outright: the file can set
any flag) and value types other than numbers and choices (JSON, paths: vLLM's own error names them).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final

from rooftop_api.errors import ApiError

TABLE_FILE: Final = "vllm_flags.json"

_GPUS = "Rooftop runs one engine per pod on the plan's tensor-parallel GPUs and scales out "
_GPUS += "with replicas (spec.constraints.minReplicas/maxReplicas)"
# vLLM dests the operator sets from the plan, and what to do instead: a second value
# would win in vLLM (the last one counts) and the plan would not describe the pods.
PLANNED: Final[Mapping[str, str]] = {
    "model": "name the model in spec.model (or spec.engine.modelVolume)",
    "model_tag": "name the model in spec.model (or spec.engine.modelVolume)",
    "served_model_name": "name the model in spec.model",
    "tensor_parallel_size": "bound it with spec.constraints.maxTensorParallel",
    "pipeline_parallel_size": _GPUS,
    "data_parallel_size": _GPUS,
    "data_parallel_size_local": _GPUS,
    "prefill_context_parallel_size": _GPUS,  # multiplies vLLM's world size (GPU count)
    "max_num_seqs": "the plan and the feedback loop choose it",
    "max_num_batched_tokens": "the plan times prompts in chunks of its token budget per step",
    "max_model_len": "set spec.engine.maxModelLen",
    "gpu_memory_utilization": "the plan chooses it and sizes the KV cache with it",
    "kv_cache_memory_bytes": "the plan sizes the KV cache",
    "num_gpu_blocks_override": "the plan sizes the KV cache",
    "quantization": "choose with spec.constraints.weightDtypes",
    "dtype": "choose with spec.constraints.weightDtypes",
    "kv_cache_dtype": "choose with spec.constraints.kvDtypes",
    # The plan times prompts in chunks of --max-num-batched-tokens; with chunked prefill
    # off, vLLM refuses a context longer than that budget and the pod crash-loops.
    "enable_chunked_prefill": "the plan prefills prompts in chunks of its token budget, "
    "which needs chunked prefill",
    "shutdown_timeout": "Rooftop plans it from the workload's request duration, so a "
    "scale-down or rollout lets in-flight requests finish",
}
# Dests the pod needs left alone: the operator sets them, or they would break the pod.
RESERVED: Final[Mapping[str, str]] = {
    "port": "the Service and the probes depend on it",
    "host": "the Service and the probes reach the engine on every interface",
    "uds": "the Service and the probes reach the engine on its TCP port",
    "config": "a config file can set any flag, the plan's included; list the flags here",
    "help": "vLLM would print its help and exit",
    "disable_log_stats": "the feedback loop and the dashboards read the engine's metrics, "
    "which this flag turns off",
    "headless": "a headless engine runs no API server: the probes would never pass",
}
# Dests vLLM collects from every occurrence (argparse's append): the operator sets one
# value and a user's extraArgs add theirs (vLLM applies each --middleware).
ADDITIVE: Final = frozenset({"middleware"})
# Dests that carry a secret: written here it would be stored in plain text in the
# resource (readable by anyone who may read ServingTargets) and in the pod's command line.
SECRET_FLAGS: Final[Mapping[str, str]] = {
    "api_key": "put the key in a Secret and name it in spec.engine.apiKeySecretRef "
    "(the engine reads it as VLLM_API_KEY)",
    "hf_token": "put the token in a Secret and name it in spec.engine.hfTokenSecretRef "
    "(the engine reads it as HF_TOKEN)",
}
# Environment variables that carry a secret, with the Secret reference to use instead.
SECRET_ENV: Final[Mapping[str, str]] = {
    "HF_TOKEN": "spec.engine.hfTokenSecretRef",
    "HUGGING_FACE_HUB_TOKEN": "spec.engine.hfTokenSecretRef",
    "VLLM_API_KEY": "spec.engine.apiKeySecretRef",
}
# Flags vLLM dropped, with what replaced them (the suggestion a typo would not get).
REMOVED: Final[Mapping[str, str]] = {
    "--disable-log-requests": "drop it (requests are not logged unless --enable-log-requests)",
    "--speculative-model": "use --speculative-config JSON",
    "--num-speculative-tokens": "use --speculative-config JSON",
    "--num-scheduler-steps": "drop it (removed with vLLM's V0 engine)",
    "--use-v2-block-manager": "drop it (removed with vLLM's V0 engine)",
    "--swap-space": "drop it (removed with vLLM's V0 engine)",
}
# argparse's test for "a negative number, so a value": the parser has no such options.
_NEGATIVE_NUMBER: Final = re.compile(r"^-\d+$|^-\d*\.\d+$")
_OPTIMIZATION_LEVELS: Final = frozenset({"0", "1", "2", "3"})
# vLLM's human_readable_int: 25.6k (decimal suffix), 2M (binary suffix: whole numbers).
_HUMAN_INT: Final = re.compile(r"(\d+(?:\.\d+)?)([kmgt])|(\d+)([KMGT])")
_NUMBERS: Final[Mapping[str, str]] = {
    "int": "an integer",
    "float": "a number",
    "human_int": "an integer (suffixes k, M, G: 8k, 2M)",
    "human_int_or_auto": "an integer (8k, 2M), -1 or auto",
}


def check_env_name(name: str) -> None:
    """Raise ValueError for an engine variable that carries a secret (``SECRET_ENV``):
    a plain value is stored in the resource in clear text; the Secret reference named
    in the message keeps it in a Secret."""
    if name in SECRET_ENV:
        raise ValueError(
            f"env: {name} carries a secret, which would be stored in plain text in the "
            f"ServingTarget; put it in a Secret and name that in {SECRET_ENV[name]}"
        )


class ExtraArgError(ApiError):
    """An extra argument vLLM would refuse, or one that sets what the plan sets."""


@dataclass(frozen=True)
class Flag:
    """One argparse action of ``vllm serve``."""

    options: tuple[str, ...]
    dest: str
    nargs: int | str | None  # None: one value; 0: a switch; "?", "+", "*"
    choices: tuple[str | int | None, ...] | None = None
    convert: tuple[str, ...] = ()
    number: str | None = None  # "int", "float", "human_int", "human_int_or_auto"


@dataclass(frozen=True)
class FlagTable:
    vllm_version: str
    by_option: Mapping[str, Flag]


@dataclass(frozen=True)
class ParsedArg:
    """What one extra argument does: ``arg`` (as written) sets ``dest`` via ``option``."""

    arg: str
    option: str
    dest: str
    values: tuple[str, ...]


def _flag(entry: Mapping[str, Any]) -> Flag:
    choices = entry.get("choices")
    return Flag(
        options=tuple(entry["options"]),
        dest=entry["dest"],
        nargs=entry["nargs"],
        choices=None if choices is None else tuple(choices),
        convert=tuple(entry.get("convert", ())),
        number=entry.get("type"),
    )


@cache
def load_table() -> FlagTable:
    """The packaged flag table (vLLM version and every ``vllm serve`` option)."""
    text = resources.files("rooftop_api").joinpath(TABLE_FILE).read_text()
    data = json.loads(text)
    flags = [_flag(entry) for entry in data["flags"]]
    by_option = {option: flag for flag in flags for option in flag.options}
    return FlagTable(vllm_version=data["vllm_version"], by_option=by_option)


# ---- vLLM's FlexibleArgumentParser rewrites ----------------------------------------


@dataclass(frozen=True)
class _Token:
    text: str  # after vLLM's rewrites
    arg: str  # the extra argument it came from, for messages


def _dashes(arg: str) -> str:
    """``--max_num_seqs=a_b`` -> ``--max-num-seqs=a_b``: only the name, up to a ``.``."""
    key, sep, value = arg.partition("=")
    head, dot, rest = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest + sep + value


def _rewrite(args: Sequence[str]) -> Iterator[_Token]:
    """vLLM's first pass: underscores, ``--help=``, ``-O``."""
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            yield _Token("--help", arg)
        elif arg.startswith("--"):
            yield _Token(_dashes(arg), arg)
        elif arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            yield from (_Token("--optimization-level", arg), _Token(level, arg))
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in _OPTIMIZATION_LEVELS:
            yield _Token("--optimization-level", arg)
        else:
            yield _Token(arg, arg)


def _dotted_key(text: str) -> tuple[str, str | None] | None:
    """(key, ``=`` value) of a dotted JSON argument, or None for any other token."""
    if not text.startswith("-") or "." not in text:
        return None
    key, sep, value = text.partition("=")
    if sep and "." not in key:
        return None  # the dot was in the value
    return key, (value if sep else None)


def _undot(tokens: list[_Token]) -> list[_Token]:
    """vLLM's second pass: each ``--json-arg.key value`` becomes ``--json-arg JSON``,
    moved to the end. Any token that starts with ``-`` and has a dot in its name counts,
    a value too (``-0.5``): vLLM does the same."""
    kept: list[_Token] = []
    moved: list[_Token] = []
    skip = False
    for i, token in enumerate(tokens):
        if skip:
            skip = False
            continue
        dotted = _dotted_key(token.text)
        if dotted is None:
            kept.append(token)
            continue
        key, value = dotted
        if value is None:
            if i + 1 == len(tokens):
                raise ExtraArgError(f"extraArgs: {token.arg!r} needs a value (vLLM would crash)")
            skip = True
        base = key.split(".", 1)[0]
        moved += [_Token(base, token.arg), _Token("{}", token.arg)]  # JSON: any dict
    return kept + moved


# ---- argparse ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Option:
    flag: Flag
    option: str
    explicit: str | None  # the value glued on with "=" (or to a short option)


def _matches(text: str, table: FlagTable) -> list[tuple[str, str | None]]:
    """argparse's ``_get_option_tuples``: (option string, explicit value) candidates."""
    if text.startswith("--"):
        prefix, sep, value = text.partition("=")
        return [(o, value if sep else None) for o in table.by_option if o.startswith(prefix)]
    out: list[tuple[str, str | None]] = []
    for option in table.by_option:
        if option == text[:2]:  # a one-letter short option glued to its value: -qawq
            out.append((option, text[2:]))
        elif option.startswith(text):
            out.append((option, None))
    return out


def _classify(token: _Token, table: FlagTable) -> _Option | str | None:
    """argparse's ``_parse_optional``: an option, None for a value/positional, or the
    text of an option-looking token that names no option."""
    text = token.text
    if not text.startswith("-") or text in ("-", "--"):  # "--": all after it positional
        return None
    if text in table.by_option:
        return _Option(table.by_option[text], text, None)
    key, sep, value = text.partition("=")
    if sep and key in table.by_option:
        return _Option(table.by_option[key], key, value)
    found = _matches(text, table)
    if len(found) > 1:
        names = ", ".join(option for option, _ in found)
        raise ExtraArgError(
            f"extraArgs: {token.arg!r} is ambiguous in vLLM (it could be {names}); "
            "spell the flag out"
        )
    if found:
        option, explicit = found[0]
        return _Option(table.by_option[option], option, explicit)
    if _NEGATIVE_NUMBER.match(text) or " " in text:
        return None
    return text


def _unknown(token: _Token, text: str, table: FlagTable) -> ExtraArgError:
    name = text.partition("=")[0]
    if name in REMOVED:
        advice = REMOVED[name]
    else:
        close = difflib.get_close_matches(name, list(table.by_option), n=3, cutoff=0.75)
        advice = f"did you mean {' or '.join(close)}?" if close else "see `vllm serve --help`"
    return ExtraArgError(
        f"extraArgs: {token.arg!r}: vLLM {table.vllm_version} has no flag {name} and the "
        f"engine would exit on it; {advice}"
    )


def _convert(value: str, steps: Sequence[str]) -> str | int | None:
    """The value as the action's type turns it before argparse checks the choices."""
    out: str | int | None = value
    for step in steps:
        if step == "none" and value in ("", "None"):
            return None
        if step == "int":
            out = int(value)
        if step == "lower_dash":
            out = value.lower().replace("-", "_")
    return out


def _is_number(value: str, kind: str) -> bool:
    """Whether vLLM's type for ``kind`` converts ``value`` (the same Python functions)."""
    text = value.strip()
    if kind == "human_int_or_auto" and (text == "-1" or text.lower() == "auto"):
        return True
    if kind.startswith("human_int") and _HUMAN_INT.fullmatch(text):
        return True
    try:
        float(text) if kind == "float" else int(text)
    except ValueError:
        return False
    return True


def _check_value(token: _Token, opt: _Option, value: str) -> None:
    """argparse converts a value with the action's type, then checks its choices."""
    flag = opt.flag
    if "none" in flag.convert and value in ("", "None"):
        pass  # vLLM's optional_type: None
    elif flag.number is not None and not _is_number(value, flag.number):
        raise ExtraArgError(
            f"extraArgs: {token.arg!r}: {opt.option} takes {_NUMBERS[flag.number]}, not {value!r}"
        )
    if flag.choices is None:
        return
    try:
        ok = _convert(value, flag.convert) in flag.choices
    except ValueError:
        ok = False
    if not ok:
        listed = ", ".join(str(c) for c in flag.choices if c is not None)
        raise ExtraArgError(
            f"extraArgs: {token.arg!r}: {value!r} is not a choice of {opt.option} "
            f"(vLLM accepts {listed})"
        )


def _value_count(opt: _Option, token: _Token, available: int) -> int:
    """How many of the ``available`` following values the option consumes (argparse)."""
    nargs = opt.flag.nargs
    if nargs == "?":
        return min(1, available)
    if nargs == "*":
        return available
    low = 1 if nargs is None or nargs == "+" else int(nargs)
    if available < low:
        raise ExtraArgError(f"extraArgs: {token.arg!r}: {opt.option} expects a value")
    return available if nargs == "+" else low


def _values(opt: _Option, token: _Token, following: Sequence[_Token | None]) -> int:
    """Values of ``opt`` from the tokens after it (None marks an option); returns how many
    it consumed. A glued value (``--flag=v``, ``-qawq``) is the only one it takes."""
    if opt.explicit is not None:
        if opt.flag.nargs == 0:
            raise ExtraArgError(
                f"extraArgs: {token.arg!r}: {opt.option} is a switch and takes no value"
            )
        return 0
    if opt.flag.nargs == 0:
        return 0
    available = 0
    while available < len(following) and following[available] is not None:
        available += 1
    return _value_count(opt, token, available)


def resolve(
    args: Sequence[str], table: FlagTable | None = None, values: bool = True
) -> list[ParsedArg]:
    """What each of ``args`` (extra ``vllm serve`` arguments) sets, as vLLM parses them.

    Raises ExtraArgError for what vLLM would refuse: a flag it does not have, an
    ambiguous prefix, a missing value, a positional and, unless ``values`` is False, a
    value that is not a number where one is needed or not one of the flag's choices.
    """
    table = table or load_table()
    tokens = _undot(list(_rewrite(args)))
    kinds = [_classify(t, table) for t in tokens]  # argparse classifies every token first
    settings: list[ParsedArg] = []
    i = 0
    while i < len(tokens):
        token, kind = tokens[i], kinds[i]
        if kind is None:
            raise ExtraArgError(
                f"extraArgs: {token.arg!r} is a positional argument; vLLM takes one, the "
                "model, which Rooftop sets (name it in spec.model); give a flag's value "
                "right after the flag or as --flag=value"
            )
        if isinstance(kind, str):
            raise _unknown(token, kind, table)
        after = zip(tokens[i + 1 :], kinds[i + 1 :], strict=True)
        count = _values(kind, token, [t if k is None else None for t, k in after])
        given = [kind.explicit] if kind.explicit is not None else []
        given += [t.text for t in tokens[i + 1 : i + 1 + count]]
        for value in given if values else []:
            _check_value(token, kind, value)
        settings.append(ParsedArg(token.arg, kind.option, kind.flag.dest, tuple(given)))
        i += 1 + count
    return settings


def check_extra_args(args: Sequence[str], table: FlagTable | None = None) -> None:
    """Raise ExtraArgError naming the first extra argument vLLM would refuse or that
    sets what Rooftop sets (``PLANNED``, ``RESERVED``) or carries a secret
    (``SECRET_FLAGS``), with what to do instead.
    A flag Rooftop owns is named as such even where its value is wrong too."""
    for setting in resolve(args, table, values=False):
        spelled = "" if setting.arg == setting.option else f" ({setting.option})"
        what = f"extraArgs: {setting.arg!r} sets {setting.dest}{spelled}"
        if setting.dest in PLANNED:
            raise ExtraArgError(
                f"{what}, which Rooftop sets from the plan; remove it ({PLANNED[setting.dest]})"
            )
        if setting.dest in RESERVED:
            raise ExtraArgError(f"{what}; remove it ({RESERVED[setting.dest]})")
        if setting.dest in SECRET_FLAGS:
            raise ExtraArgError(
                f"{what}, a secret that would be stored in plain text; remove it and "
                f"{SECRET_FLAGS[setting.dest]}"
            )
    resolve(args, table)  # now the values
