"""What vLLM loads for a planned weight dtype, and how its flags spell the dtypes.

A weight dtype is a property of the checkpoint, not a switch: vLLM serves 16-bit
weights from the model's own checkpoint (``--dtype`` casts between bf16 and fp16) and
quantizes fp8 online at load time (``--quantization fp8_per_tensor``), but int8, int4
and fp4 need a checkpoint already in that format (AWQ, GPTQ, W8A8, NVFP4); vLLM reads
its format from the checkpoint's own ``quantization_config``. A quantized checkpoint is
a different set of weights, so the plan names it and says so.

Pure functions: the planner only offers a dtype that resolves here, and the operator's
builders render the flags from the same answers, so what is planned is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooftop_api.spec import MODELS_MOUNT, ServingTargetSpec
from rooftop_planner.catalog import ModelSpec
from rooftop_planner.errors import PlannerError

# Planned 16-bit weight dtype -> vLLM --dtype.
VLLM_DTYPE: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16"}
# vLLM's name for quantizing a 16-bit checkpoint to fp8 at load time (per-tensor scales;
# the plain "fp8" spelling is deprecated from vLLM 0.33).
ONLINE_FP8 = "fp8_per_tensor"


@dataclass(frozen=True)
class Weights:
    """The checkpoint behind one weight dtype.

    Attributes:
        model: what vLLM loads: a Hugging Face repo id or a path in the pod.
        dtype: the planned weight dtype (bf16, fp16, fp8, int8, int4, fp4).
        quantization: vLLM ``--quantization`` for online quantization, else None
            (a pre-quantized checkpoint declares its own format).
        note: where the weights come from, for the plan and ``kubectl describe``.
    """

    model: str
    dtype: str
    quantization: str | None
    note: str


def base_model(spec: ServingTargetSpec, model: ModelSpec) -> str:
    """The model's own (16-bit) checkpoint: a path on the model volume, else the
    catalog's repo, else ``spec.model`` itself (a repo id described by modelConfig)."""
    volume = spec.engine.model_volume
    if volume is not None:
        return f"{MODELS_MOUNT}/{volume.path.rstrip('/')}"
    if spec.model_config_json is None and model.hf_repo:
        return model.hf_repo
    return spec.model


def _named_checkpoint(spec: ServingTargetSpec, model: ModelSpec, dtype: str) -> tuple[str, str]:
    """(model, format) of a checkpoint named for ``dtype``: the spec's, else the
    catalog's; ("", "") when neither names one."""
    own = (spec.engine.checkpoints or {}).get(dtype)
    if own is not None:
        return own.model, own.format
    listed = model.checkpoints.get(dtype)
    if listed is not None:
        return listed.repo, listed.format
    return "", ""


def resolve_weights(spec: ServingTargetSpec, model: ModelSpec, dtype: str) -> Weights | str:
    """The checkpoint vLLM loads for weight dtype ``dtype``, or why there is none."""
    base = base_model(spec, model)
    if dtype in VLLM_DTYPE:
        return Weights(base, dtype, None, f"{dtype} weights of {base}")
    repo, fmt = _named_checkpoint(spec, model, dtype)
    if repo:
        what = f"{fmt} " if fmt else ""
        note = f"weights from {repo} ({what}{dtype} checkpoint: different weights from {base}'s)"
        return Weights(repo, dtype, None, note)
    if dtype == "fp8":
        note = f"fp8 weights quantized by vLLM at load from {base} (not bit-identical to it)"
        return Weights(base, dtype, ONLINE_FP8, note)
    return (
        f"no {dtype} checkpoint of {model.id} is known and vLLM cannot quantize to {dtype} at "
        f"load; name one in spec.engine.checkpoints.{dtype} (a published "
        f"{_KIND.get(dtype, dtype)} repository of the same model)"
    )


_KIND = {"int4": "AWQ or GPTQ", "int8": "W8A8 or GPTQ-Int8", "fp4": "NVFP4"}


def vllm_kv_cache_dtype(weight_dtype: str, kv_dtype: str) -> str:
    """vLLM ``--kv-cache-dtype`` for a planned KV dtype.

    vLLM stores the KV cache in the model's dtype (``auto``) or fp8; an explicit
    ``bfloat16`` is refused for models whose dtype differs, so a 16-bit KV cache is
    spelled ``auto`` and planned only where the model's dtype is that 16-bit type.

    Raises:
        PlannerError: vLLM cannot store this KV dtype with these weights (a ValueError).
    """
    if kv_dtype in ("auto", "fp8"):
        return kv_dtype
    if kv_dtype in VLLM_DTYPE and kv_dtype == weight_dtype:
        return "auto"
    if kv_dtype in VLLM_DTYPE:
        raise PlannerError(
            f"vLLM keeps a 16-bit KV cache in the model's dtype: kv {kv_dtype} needs weight "
            f"dtype {kv_dtype} (use kvDtype auto)"
        )
    raise PlannerError(f"vLLM has no {kv_dtype} KV cache (use auto or fp8)")


def kv_problem(weight_dtype: str, kv_dtype: str) -> str:
    """Why vLLM cannot run this weight/KV pair, else ""."""
    try:
        vllm_kv_cache_dtype(weight_dtype, kv_dtype)
    except PlannerError as err:
        return str(err)
    return ""
