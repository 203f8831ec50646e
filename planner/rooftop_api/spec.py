"""The ServingTarget resource as pydantic models: the single source of truth.

The planner reads these models from a manifest (``rooftop plan``); the operator's
CRD (``charts/rooftop/crds/``) is generated from the same models
(``python -m rooftop_api.crd``), so a field exists in exactly one place.

Field names are snake_case in Python and camelCase in YAML (Kubernetes style);
units live in the names (``tpot_ms``, ``usd_per_hour``). Every model forbids
unknown fields so that a typo is an error naming the field, not a silent default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rooftop_api.vllm_args import ExtraArgError, check_env_name, check_extra_args, resolve

# The resource's identity, spelled here only: the CRD (crd.py), the manifest loader, the
# operator's watches and API calls, and its annotation prefix all read these.
GROUP: Final = "rooftop.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ServingTarget"
PLURAL: Final = "servingtargets"
SINGULAR: Final = "servingtarget"
# The label every engine pod carries with its target's name (the Deployment's selector;
# the GPU inventory tells a target's own pods from others' by it).
TARGET_LABEL: Final = f"{GROUP}/{SINGULAR}"
# A mixed fleet's engine pods and pool Deployments: the pool's GPU id.
POOL_LABEL: Final = f"{GROUP}/pool"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,  # YAML's .nan/.inf would slip past every range check
    )


# The share of a percentile's allowed misses Rooftop keeps in hand: a p90 target is sized
# and run for 95 % of requests within the TPOT bound, a p99 one for 99.5 %. One window's
# share scatters by a few points around the fleet's; aimed at the percentile itself, half
# the windows would miss it. The planner sizes at this share (so a plan's price is what
# the loop is expected to spend) and the loop's latency trim steers to it.
AIM_MARGIN = 0.5


def aimed_share(quantile: float) -> float:
    """The share (0..1) of requests within the TPOT bound that plan and loop aim at for
    a percentile's quantile: ``q + AIM_MARGIN · (1 − q)``."""
    return quantile + AIM_MARGIN * (1.0 - quantile)


class Percentile(StrEnum):
    """Which percentile of the latency distribution the SLO bounds."""

    P50 = "p50"
    P90 = "p90"
    P95 = "p95"
    P99 = "p99"

    @property
    def quantile(self) -> float:
        """The percentile as a 0..1 quantile (p90 -> 0.9)."""
        return int(self.value[1:]) / 100.0

    @property
    def aim(self) -> float:
        """The share of requests plan and loop aim to keep within the bound
        (``aimed_share``: p90 -> 0.95)."""
        return aimed_share(self.quantile)


class WeightDtype(StrEnum):
    """How weights are stored. int4 covers AWQ/GPTQ checkpoints; fp4 is NVFP4/MXFP4."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    FP4 = "fp4"


class KvDtype(StrEnum):
    """How the KV cache is stored, as vLLM can. ``auto`` follows the activation dtype (16-bit)."""

    AUTO = "auto"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


# KV dtypes people ask for that vLLM cannot store: named in the error, with the fix.
NO_VLLM_KV_DTYPES = ("int8", "int4")


class SpeculativeMethod(StrEnum):
    """How vLLM drafts the tokens a speculative step verifies: ``eagle3``, an EAGLE-3
    head trained for the model; ``draft_model``, a smaller model of the same family and
    vocabulary; ``ngram``, prompt lookup (the tokens that followed the sequence's latest
    n-gram where it occurred before, found on the host; no model); ``suffix``, suffix
    decoding (what followed the sequence's latest tokens in its prompt and in earlier
    answers, from suffix trees on the host, Arctic Inference's; no model); ``mtp``, the
    model's own multi-token-prediction layers, where its checkpoint has them
    (DeepSeek-V3).
    vLLM's rejection sampling keeps the model's output distribution at any temperature,
    so speculation changes speed, not answers."""

    EAGLE3 = "eagle3"
    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"
    SUFFIX = "suffix"
    MTP = "mtp"


# The methods that draft on the host between steps, with no model of their own.
HOST_METHODS = (SpeculativeMethod.NGRAM, SpeculativeMethod.SUFFIX)


# vLLM refuses async scheduling beside ngram and suffix drafts (vllm/config/vllm.py: "async
# scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU..."); it turns it
# off itself unless a flag turns it on.
ASYNC_SCHEDULING_FLAGS = ("--async-scheduling", "--async_scheduling")


class Mode(StrEnum):
    """``vllm`` deploys real vLLM on GPUs; ``simulated`` deploys the engine simulator."""

    VLLM = "vllm"
    SIMULATED = "simulated"


PositiveMs = Annotated[float, Field(gt=0, le=3_600_000)]


class Slo(_Model):
    """Latency objective: time per output token and time to first token."""

    tpot_ms: PositiveMs = Field(description="Time per output token bound, milliseconds.")
    tpot_percentile: Percentile = Field(
        default=Percentile.P90, description="Percentile the TPOT bound applies to."
    )
    ttft_ms: PositiveMs | None = Field(
        default=None, description="Time to first token bound, milliseconds (optional)."
    )
    ttft_percentile: Percentile = Field(
        default=Percentile.P90, description="Percentile the TTFT bound applies to."
    )

    @property
    def burst_aim(self) -> float:
        """The share of requests whose arrival rate a fleet holds capacity for against
        bursts: the TPOT bound's aim, or the TTFT bound's where it asks for more (every
        request arriving into a burst beyond capacity queues, so a p99 TTFT bound over a
        p90 TPOT one needs the bursts 99.5 % of requests arrive into)."""
        aims = [self.tpot_percentile.aim]
        if self.ttft_ms is not None:
            aims.append(self.ttft_percentile.aim)
        return max(aims)


class HistogramBin(_Model):
    """One bin of a token-length histogram: ``weight`` of requests have ``tokens`` tokens."""

    tokens: int = Field(ge=1, le=10_000_000)
    # relative weights; the bound keeps their sum finite (256 bins of 1e308 overflow)
    weight: float = Field(gt=0, le=1e12)


class TokenLengths(_Model):
    """A token-length distribution: mean and p90, or a histogram."""

    mean: float | None = Field(default=None, ge=1, le=10_000_000, description="Mean tokens.")
    p90: float | None = Field(default=None, ge=1, le=10_000_000, description="p90 tokens.")
    histogram: list[HistogramBin] | None = Field(
        default=None, min_length=1, max_length=256, description="Lengths and their weights."
    )

    @model_validator(mode="after")
    def _one_form(self) -> TokenLengths:
        if self.histogram is None and self.mean is None:
            raise ValueError("give either mean (and optionally p90) or histogram")
        if self.histogram is not None and self.mean is not None:
            raise ValueError("give either mean/p90 or histogram, not both")
        if self.mean is not None and self.p90 is not None and self.p90 < self.mean:
            raise ValueError(f"p90 ({self.p90}) must be >= mean ({self.mean})")
        return self


class Router(StrEnum):
    """What spreads requests over the engine replicas."""

    SERVICE = "Service"  # the target's Kubernetes Service (kube-proxy: a random pod)
    PREFIX_AWARE = "PrefixAware"  # a router that sends a prompt where its prefix is cached


class PrefixReuse(_Model):
    """What prompts repeat, so vLLM's prefix cache skips their prefill."""

    shared_tokens: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="Tokens every prompt starts with (system prompt, tool schemas); "
        "cached on every replica after its first request.",
    )
    session_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share 0..1 of each prompt's other tokens that repeat an earlier "
        "request of the same session or document (chat history, an agent's trajectory); "
        "a hit only on the replica that served that request.",
    )
    session_gap_seconds: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="Mean seconds between a session's consecutive requests (a user's "
        "think time): the KV cache must keep the session's blocks that long, while other "
        "requests write theirs, for its history to hit. Unset: assumed kept.",
    )
    router: Router = Field(
        default=Router.SERVICE,
        description="Service: the target's Service spreads requests (a session's earlier "
        "request is on the same replica about 1 time in R). PrefixAware: a prefix-aware "
        "router in front keeps each session where its prefix is cached.",
    )
    client_ip_sessions: bool = Field(
        default=False,
        alias="clientIPSessions",  # as Kubernetes spells ClientIP
        description="Each session's requests reach the Service from one client IP (no "
        "gateway in between): the planner may then set sessionAffinity: ClientIP, which "
        "keeps a session on one replica, where it pays.",
    )


class Workload(_Model):
    """Expected traffic: arrival rate and prompt/output lengths."""

    requests_per_second: float = Field(ge=0, le=1_000_000, description="Mean arrival rate.")
    prompt_tokens: TokenLengths = Field(description="Prompt (input) length distribution.")
    output_tokens: TokenLengths = Field(description="Output length distribution.")
    prefix: PrefixReuse | None = Field(
        default=None,
        description="What prompts repeat, for vLLM's prefix cache (absent: the planner "
        "prices every prompt token's prefill).",
    )
    arrival_dispersion: float | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="How bursty arrivals are: the variance of the requests counted in "
        "15-second intervals over their mean (1: independent arrivals, the default; chat "
        "traffic reads about 1.3, code completion, where one editor fires several "
        "requests at once, tens; gamma-spaced arrivals with vllm bench serve's "
        "--burstiness k read about 1/k). The planner holds capacity for the 15-second "
        "rate the SLO's share of requests arrives into; the operator measures it and "
        "condition WorkloadObserved says when it differs.",
    )
    acceptance_rate: float | None = Field(
        default=None,
        gt=0,
        le=0.99,
        description="Per-token acceptance of speculative decoding on this traffic: the "
        "chance the model accepts each draft token (a step verifying K draft tokens then "
        "yields (1 - a^(K+1)) / (1 - a) tokens per sequence). Replaces the drafter's "
        "published figure for every method in constraints.speculative; code and RAG "
        "usually accept more than chat. Needed for ngram and suffix, over every decode step "
        "(a step where the lookup finds no match counts as a first draft rejected).",
    )


class Budget(_Model):
    """Spend ceiling for the whole target (all replicas)."""

    usd_per_hour: float = Field(ge=0, le=10_000_000, description="Maximum USD per hour.")


# Kubernetes' own limits on labels, which nodeSelector and tolerations reuse: a key is
# an optional DNS-subdomain prefix (<= 253) and a name (<= 63); a value is <= 63
# characters. Without them the API server refuses the engine Deployment (HTTP 422).
# ``[.]`` rather than an escaped dot: a CEL rule (crd.py) embeds the same text.
LABEL_KEY_LENGTH = 253 + 1 + 63
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE_LENGTH = 63
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelKey = Annotated[str, Field(min_length=1, max_length=LABEL_KEY_LENGTH, pattern=LABEL_KEY)]
LabelValue = Annotated[str, Field(max_length=LABEL_VALUE_LENGTH, pattern=LABEL_VALUE)]
# A map key's bound (its pattern is checked by a validator and a CEL rule: a key pattern
# in the type becomes JSON Schema patternProperties, which the CRD cannot express).
LabelKeyLength = Annotated[str, Field(min_length=1, max_length=LABEL_KEY_LENGTH)]


class Toleration(_Model):
    """A Kubernetes toleration (subset of core/v1 Toleration)."""

    key: LabelKey | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=10**9,
        description="How long a `NoExecute` taint is tolerated (only with effect NoExecute).",
    )

    @model_validator(mode="after")
    def _as_kubernetes_checks(self) -> Toleration:
        # the API server's own rules for a toleration (else the Deployment is refused)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(
                "tolerationSeconds applies only to effect NoExecute; remove it "
                "or set effect: NoExecute"
            )
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty with operator Exists")
        return self


class Constraints(_Model):
    """Limits on the search and on where pods may run."""

    gpu_types: list[Annotated[str, Field(max_length=64)]] | None = Field(
        default=None, max_length=64, description="Allowed GPU catalog ids (default: all)."
    )
    weight_dtypes: list[WeightDtype] | None = Field(
        default=None,
        max_length=len(WeightDtype),
        description="Allowed weight dtypes. Default: bf16 only, the model's 16-bit weights "
        "(list fp16 to serve a model published in fp16 as is). fp8, int8, int4 and fp4 "
        "weights change the model's outputs, so they are planned only when listed here.",
    )
    kv_dtypes: list[KvDtype] | None = Field(
        default=None,
        max_length=8,
        description="Allowed KV cache dtypes. Default: auto (16-bit) and fp8, which halves "
        "the cache and changes outputs slightly; at equal cost the 16-bit cache is planned, "
        "and [auto] allows only it. vLLM has no int8 or int4 KV cache.",
    )
    max_tensor_parallel: int | None = Field(default=None, ge=1, le=64)
    prefill_chunk_tokens: list[Annotated[int, Field(ge=512, le=65536)]] | None = Field(
        default=None,
        max_length=8,
        description="Prefill chunks the planner may choose among (vLLM "
        "--max-num-batched-tokens, the most tokens one engine step takes; at least 512, "
        "the largest batch cap). Default: 8192 only. A smaller chunk prefills a long "
        "prompt over more, shorter steps, so a short answer shares fewer of them, at the "
        "price of TTFT; it is planned only where it is cheaper.",
    )
    speculative: list[SpeculativeMethod] | None = Field(
        default=None,
        max_length=len(SpeculativeMethod),
        description="Speculative decoding methods the planner may choose (eagle3, "
        "draft_model with a drafter the catalog names for the model or engine.drafter; "
        "ngram, prompt lookup, and suffix, suffix decoding, with workload.acceptanceRate; "
        "mtp, the model's own multi-token-prediction layers where it has them). Per batch "
        "size it picks the draft length (vLLM num_speculative_tokens_per_batch_size) or none "
        "where verifying drafts costs more than they save; suffix takes one draft length "
        "at every batch. Default: none.",
    )
    min_replicas: int = Field(default=1, ge=0, le=1000)
    max_replicas: int = Field(default=16, ge=1, le=1000)
    node_selector: dict[LabelKeyLength, LabelValue] | None = Field(
        default=None, max_length=16, description="Extra node labels that engine pods require."
    )
    tolerations: list[Toleration] | None = Field(default=None, max_length=16)

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key in value or {}:
            if not re.fullmatch(LABEL_KEY, key):
                raise ValueError(
                    f"nodeSelector key {key!r} is not a label key "
                    "([prefix/]name, e.g. example.com/pool)"
                )
        return value

    @field_validator("kv_dtypes", mode="before")
    @classmethod
    def _kv_dtypes_vllm_has(cls, value: Any) -> Any:
        """Name the KV dtypes vLLM lacks and the fix, before the enum's generic error."""
        lacking = [v for v in value if v in NO_VLLM_KV_DTYPES] if isinstance(value, list) else []
        if lacking:
            raise ValueError(
                f"kvDtypes [{', '.join(map(str, lacking))}]: vLLM has no "
                f"{' or '.join(map(str, lacking))} KV cache; use auto or fp8"
            )
        return value

    @model_validator(mode="after")
    def _replica_range(self) -> Constraints:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})"
            )
        return self


class OwnedGpus(_Model):
    """GPUs of one type you own or have reserved: plans use them first, at their price."""

    count: int = Field(ge=1, le=100_000, description="How many GPUs of this type you own.")
    usd_per_gpu_hour: float = Field(
        default=0.0,
        ge=0,
        le=10_000,
        description="USD per GPU-hour of an owned GPU (0: already paid for); GPUs beyond "
        "count cost the on-demand price.",
    )


class Pricing(_Model):
    """Price overrides per catalog GPU id: on-demand $/GPU-hour, and GPUs you own."""

    usd_per_gpu_hour: dict[Annotated[str, Field(max_length=64)], float] | None = Field(
        default=None, max_length=64, description="GPU id -> on-demand USD per GPU-hour."
    )
    owned: dict[Annotated[str, Field(max_length=64)], OwnedGpus] | None = Field(
        default=None,
        max_length=64,
        description="GPU id -> GPUs of that type you own or reserved, and their price.",
    )

    @field_validator("usd_per_gpu_hour", mode="before")
    @classmethod
    def _no_bools(cls, value: Any) -> Any:
        # YAML's true/false would be read as a price of $1/$0 an hour
        for gpu, price in (value or {}).items() if isinstance(value, dict) else ():
            if isinstance(price, bool):
                raise ValueError(f"usdPerGpuHour[{gpu}] is {price}; give a price in USD")
        return value

    @model_validator(mode="after")
    def _non_negative(self) -> Pricing:
        for gpu, price in (self.usd_per_gpu_hour or {}).items():
            if price < 0:
                raise ValueError(f"usdPerGpuHour[{gpu}] is {price}; prices must be >= 0")
        return self


class SecretKeyRef(_Model):
    """A key in a Secret in the target's namespace."""

    name: str = Field(min_length=1, max_length=253)
    key: str = Field(default="token", min_length=1, max_length=253)


# A Secret's name: a DNS subdomain (RFC 1123), as Kubernetes checks it.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class LocalSecretRef(_Model):
    """A Secret in the target's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)


# Bounds that keep the largest valid spec storable (tests/unit/api/test_crd_bounds.py
# adds it up): 64 values of 1,024 characters are at most ~0.45 MB as JSON (6 bytes for
# an escaped character) in etcd, whose limit is 1.5 MiB per object. A longer value
# belongs in a Secret or ConfigMap.
ENV_NAME_LENGTH = 128
ENV_VALUE_LENGTH = 1024
ENV_ITEMS = 64


class EnvVar(_Model):
    """A plain environment variable for the engine container."""

    name: str = Field(
        min_length=1, max_length=ENV_NAME_LENGTH, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$"
    )
    value: str = Field(default="", max_length=ENV_VALUE_LENGTH)

    @field_validator("name")
    @classmethod
    def _not_a_secret(cls, value: str) -> str:
        check_env_name(value)  # HF_TOKEN, VLLM_API_KEY: Secret references instead
        return value


class ModelVolume(_Model):
    """Model files on a PersistentVolumeClaim (a private model, or a mirror of a public one).

    The claim is mounted read-only at ``/models`` and vLLM loads ``/models/<path>``.
    """

    claim_name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="PVC in the namespace."
    )
    path: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[^/]",  # relative to the claim's root
        description="The model's folder inside the claim (holds config.json).",
    )

    @field_validator("path")
    @classmethod
    def _inside_the_claim(cls, value: str) -> str:
        if ".." in value.split("/"):
            raise ValueError(f"path {value!r} has a '..' segment; give a folder inside the claim")
        return value


class Checkpoint(_Model):
    """The weights vLLM loads for one quantized weight dtype."""

    model: str = Field(
        min_length=1,
        max_length=1024,
        description="Hugging Face repo id, or a path in the pod (e.g. /models/llama-awq).",
    )
    format: str = Field(
        default="",
        max_length=64,
        description="Its quantization format (awq, gptq, compressed-tensors, fp8, "
        "modelopt_fp4), for the plan's explanation; vLLM reads the checkpoint's own.",
    )


class Drafter(_Model):
    """A drafter for speculative decoding that the drafter catalog does not list for
    the model: an EAGLE-3 head, or a smaller model of the same family and vocabulary."""

    method: SpeculativeMethod = Field(
        description="eagle3 or draft_model (ngram, suffix and mtp load no drafter of their own)."
    )
    model: str = Field(
        min_length=1,
        max_length=1024,
        description="What vLLM loads as the drafter: a Hugging Face repo id, or a path "
        "in the pod (e.g. /models/my-eagle-head).",
    )
    catalog_model: str | None = Field(
        default=None,
        max_length=256,
        description="draft_model: the catalog model whose shape the draft has (e.g. "
        "llama-3.1-8b); the planner prices its steps and memory from it.",
    )
    layers: int = Field(
        default=1, ge=1, le=8, description="eagle3: the head's decoder layers (1 for EAGLE-3)."
    )
    draft_vocab_size: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="eagle3: the head's own vocabulary (its config.json's draft_vocab_size; "
        "absent: the model's).",
    )

    @model_validator(mode="after")
    def _shape_for_the_method(self) -> Drafter:
        if self.method in HOST_METHODS:
            raise ValueError(
                f"drafter.method: {self.method.value} looks tokens up on the host and loads "
                f"no drafter; remove engine.drafter (constraints.speculative: "
                f"[{self.method.value}] is enough)"
            )
        if self.method == SpeculativeMethod.MTP:
            raise ValueError(
                "drafter.method: mtp drafts with the model's own layers, read from its "
                "config.json; remove engine.drafter (constraints.speculative: [mtp] is enough)"
            )
        if self.method == SpeculativeMethod.DRAFT_MODEL and not self.catalog_model:
            raise ValueError(
                "drafter.catalogModel: a draft_model drafter needs the catalog model whose "
                "shape it has (e.g. llama-3.1-8b)"
            )
        if self.method == SpeculativeMethod.EAGLE3 and self.catalog_model:
            raise ValueError(
                "drafter.catalogModel: an eagle3 head has no catalog shape; give layers "
                "and draftVocabSize instead"
            )
        return self


MODELS_MOUNT = "/models"
IMAGE_REFERENCE = r"^[a-z0-9]([a-zA-Z0-9._/:@-]*[a-zA-Z0-9_])?$"


class ModelCache(_Model):
    """Where the engine caches model weights (at /var/cache/rooftop/huggingface, its HF_HOME)."""

    pvc_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN, description="An existing PVC to mount."
    )
    size_gi: int | None = Field(default=None, ge=1, le=100_000, description="emptyDir size limit.")


class Engine(_Model):
    """The engine container: image, extra flags, environment, secrets and cache."""

    image: str | None = Field(
        default=None,
        max_length=512,
        # A container image reference: registry/path:tag@digest, no spaces (a name with
        # surrounding whitespace was accepted and every pod then failed with FailedCreate).
        pattern=IMAGE_REFERENCE,
        description="Override the pinned engine image (a reference such as "
        "registry.example.com/vllm/vllm-openai:v0.32.0, without spaces).",
    )
    extra_args: list[Annotated[str, Field(max_length=1024)]] | None = Field(
        default=None,
        max_length=32,
        description="Extra `vllm serve` flags for the pinned vLLM, checked with vLLM's own "
        "parsing rules (prefixes, --x_y, short options): not flags that set what the plan "
        "sets, nor flags vLLM does not have.",
    )
    env: list[EnvVar] | None = Field(default=None, max_length=ENV_ITEMS)
    hf_token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding the Hugging Face token (HF_TOKEN)."
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding the key clients must send (VLLM_API_KEY: vLLM then "
        "refuses /v1 requests without `Authorization: Bearer <key>`).",
    )
    image_pull_secrets: list[LocalSecretRef] | None = Field(
        default=None,
        max_length=16,
        description="Secrets (type kubernetes.io/dockerconfigjson, in the target's "
        "namespace) for pulling the engine image from a private registry.",
    )
    model_cache: ModelCache | None = None
    model_volume: ModelVolume | None = Field(
        default=None, description="Serve model files from a PersistentVolumeClaim."
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        le=10_000_000,
        description="Longest request (prompt + output tokens) the engine accepts. Default: "
        "the model's full context where the KV cache holds one such request, else the "
        "largest that fits.",
    )
    checkpoints: dict[Annotated[str, Field(max_length=8)], Checkpoint] | None = Field(
        default=None,
        max_length=4,
        description="Weight dtype (fp8, int8, int4, fp4) -> the checkpoint already "
        "quantized to it; overrides the catalog's.",
    )
    drafter: Drafter | None = Field(
        default=None,
        description="The drafter speculative decoding may use, in place of the drafter "
        "catalog's for its method (constraints.speculative must list the method). With "
        "no published acceptance for it, state workload.acceptanceRate.",
    )

    @field_validator("checkpoints")
    @classmethod
    def _quantized_only(cls, value: dict[str, Checkpoint] | None) -> dict[str, Checkpoint] | None:
        quantized = ("fp8", "int8", "int4", "fp4")
        for dtype in value or {}:
            if dtype not in quantized:
                raise ValueError(
                    f"checkpoints.{dtype}: name checkpoints for {', '.join(quantized)}; "
                    "16-bit weights come from the model itself (spec.model or "
                    "spec.engine.modelVolume)"
                )
        return value

    @model_validator(mode="after")
    def _extra_args_leave_the_plan_alone(self) -> Engine:
        # rooftop_api.vllm_args replays vLLM's parser over a table of its flags
        check_extra_args(self.extra_args or [])
        return self


# A Hugging Face config.json is a few KiB; these leave room for the largest while keeping
# a target far below the API server's object limit.
MODEL_CONFIG_KEYS = 512
MODEL_CONFIG_BYTES = 64 * 1024


class ServingTargetSpec(_Model):
    """What the user wants: a model served to an SLO within a budget."""

    model: str = Field(
        min_length=1, max_length=256, description="Catalog id or Hugging Face repo id."
    )
    model_config_json: dict[str, Any] | None = Field(
        default=None,
        alias="modelConfig",
        max_length=MODEL_CONFIG_KEYS,
        description="Inline Hugging Face config.json, for models not in the catalog "
        f"(at most {MODEL_CONFIG_KEYS} keys and {MODEL_CONFIG_BYTES // 1024} KiB as JSON).",
    )
    slo: Slo
    workload: Workload
    budget: Budget
    constraints: Constraints = Field(default_factory=Constraints)
    pricing: Pricing = Field(default_factory=Pricing)
    mode: Mode = Mode.VLLM
    engine: Engine = Field(default_factory=Engine)

    @field_validator("model_config_json")
    @classmethod
    def _model_config_fits(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A free-form object's nested size has no bound a CRD schema can state; the
        operator checks it before it writes the ConfigMap that carries it."""
        size = len(json.dumps(value, separators=(",", ":")).encode()) if value else 0
        if size > MODEL_CONFIG_BYTES:
            raise ValueError(
                f"modelConfig is {size} bytes as JSON, over {MODEL_CONFIG_BYTES}: give only "
                "the model's config.json (the weights' config, not tokenizer files)"
            )
        return value

    @model_validator(mode="after")
    def _one_speculative_config(self) -> ServingTargetSpec:
        """With constraints.speculative the plan sets --speculative-config; one set in
        extraArgs as well would be priced as the plan's and run as the user's."""
        if self.constraints.speculative and speculative_config_in(self.engine.extra_args or []):
            raise ValueError(
                "engine.extraArgs sets --speculative-config while constraints.speculative "
                "lets the planner choose the drafter and draft lengths; remove one of them"
            )
        methods = self.constraints.speculative or []
        if SpeculativeMethod.DRAFT_MODEL in methods and sets_dest(
            self.engine.extra_args or [], "watermark_config"
        ):
            raise ValueError(
                "engine.extraArgs sets --watermark-config, which vLLM refuses beside a "
                "draft_model drafter (it watermarks only EAGLE-style drafts); remove "
                "draft_model from constraints.speculative or the watermark config"
            )
        host = [m.value for m in methods if m in HOST_METHODS]
        if host and _turns_on(self.engine.extra_args or [], ASYNC_SCHEDULING_FLAGS):
            raise ValueError(
                f"engine.extraArgs sets --async-scheduling, which vLLM refuses beside "
                f"{' and '.join(host)} drafts (they are looked up on the host between "
                f"steps); remove {' and '.join(host)} from constraints.speculative or the flag"
            )
        drafter = self.engine.drafter
        if drafter is not None and drafter.method not in methods:
            raise ValueError(
                f"engine.drafter is a {drafter.method.value} drafter, which "
                "constraints.speculative does not list; add it there or remove the drafter"
            )
        return self


def speculative_config_in(args: list[str]) -> bool:
    """Whether ``args`` set vLLM's speculative config (any spelling vLLM parses)."""
    return sets_dest(args, "speculative_config")


def given_speculative_config(args: list[str]) -> dict[str, Any] | None:
    """The JSON object the --speculative-config in ``args`` gives, as vLLM parses the
    flag (None: none given, or not a JSON object; the spec refuses malformed flags)."""
    try:
        given = resolve(args, values=True)
    except ExtraArgError:
        return None
    for parsed in given:
        if parsed.dest != "speculative_config" or not parsed.values:
            continue
        try:
            config = json.loads(parsed.values[0])
        except json.JSONDecodeError:
            return None
        return config if isinstance(config, dict) else None
    return None


def suffix_schedule_problem(config: dict[str, Any]) -> str | None:
    """Why vLLM would stop on a suffix-decoding ``config`` (a --speculative-config JSON
    object) at its first drafting step: a per-batch schedule giving another length than
    num_speculative_tokens (vLLM's suffix proposer asserts the one length:
    vllm/v1/spec_decode/suffix_decoding.py; vLLM's default K is 24, its trees' depth).
    None where vLLM runs it."""
    if config.get("method") != SpeculativeMethod.SUFFIX:
        return None
    k = config.get("num_speculative_tokens", SUFFIX_DEFAULT_DRAFT_TOKENS)
    schedule = config.get("num_speculative_tokens_per_batch_size") or []
    lengths = {r[2] for r in schedule if isinstance(r, list) and len(r) == 3}
    if lengths <= {k}:
        return None
    return (
        "engine.extraArgs: --speculative-config drafts by suffix with "
        "num_speculative_tokens_per_batch_size; vLLM's suffix proposer drafts one length "
        "at every batch and stops at the first step the schedule changes it: remove the "
        "schedule (or let constraints.speculative: [suffix] choose the length)"
    )


# vLLM's num_speculative_tokens for suffix decoding when the JSON gives none: its trees'
# depth, suffix_decoding_max_tree_depth (vllm/config/speculative.py).
SUFFIX_DEFAULT_DRAFT_TOKENS = 24


def _turns_on(args: list[str], flags: tuple[str, ...]) -> bool:
    """Whether ``args`` hold one of ``flags`` (a switch: vLLM's --no- spelling turns it
    off and is not one of them)."""
    return any(a == f or a.startswith(f + "=") for a in args for f in flags)


def sets_dest(args: list[str], dest: str) -> bool:
    """Whether ``args`` set vLLM's ``dest`` (any spelling vLLM parses)."""
    try:
        return any(s.dest == dest for s in resolve(args, values=False))
    except ExtraArgError:
        return False  # refused for another reason, which the extraArgs check names


# A target's name names its children: the Service ``NAME`` and the Deployment and
# PodMonitor ``NAME-engine``. A Service name is a DNS-1035 label (at most 63 characters),
# so the name is one of at most 63 - len("-engine") = 56. The CRD's CEL rule (crd.py)
# and the manifest loader check the same pattern and length.
MAX_NAME_LENGTH = 56
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a ServingTarget, with a name that can; None when it can."""
    if re.fullmatch(NAME_PATTERN, name) and len(name) <= MAX_NAME_LENGTH:
        return None
    fix = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-").lstrip("0123456789-")
    fix = fix[:MAX_NAME_LENGTH].rstrip("-") or "my-target"
    return (
        f"{name!r} is not a valid name: use at most {MAX_NAME_LENGTH} lowercase letters, "
        "digits and '-', starting with a letter and ending with a letter or digit (a "
        f"DNS-1035 label: it names the Service and the Deployment), e.g. {fix!r}"
    )


# A namespace's name is a DNS-1123 label, as Kubernetes checks it (``kubectl create
# namespace Bad_NS`` is refused): ``rooftop render -n`` and a manifest's namespace both.
NAMESPACE_LENGTH = 63
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def namespace_problem(namespace: str) -> str | None:
    """Why ``namespace`` cannot name a Kubernetes namespace, with one that can; None
    when it can."""
    if re.fullmatch(NAMESPACE_PATTERN, namespace) and len(namespace) <= NAMESPACE_LENGTH:
        return None
    fix = re.sub(r"[^a-z0-9]+", "-", namespace.lower()).strip("-")[:NAMESPACE_LENGTH]
    return (
        f"{namespace!r} is not a valid namespace: use at most {NAMESPACE_LENGTH} lowercase "
        "letters, digits and '-', starting and ending with a letter or digit (a DNS-1123 "
        f"label), e.g. {fix.strip('-') or 'default'!r}"
    )


class Metadata(_Model):
    """The part of ObjectMeta a manifest file needs."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)
    namespace: str | None = Field(
        default=None, max_length=NAMESPACE_LENGTH, pattern=NAMESPACE_PATTERN
    )

    @field_validator("namespace", mode="before")
    @classmethod
    def _valid_namespace(cls, value: object) -> object:
        if isinstance(value, str) and (problem := namespace_problem(value)):
            raise ValueError(problem)
        return value

    @field_validator("name", mode="before")
    @classmethod
    def _valid_name(cls, value: object) -> object:
        """Say what a valid name looks like (before the bare pattern and length checks)."""
        if isinstance(value, str) and (problem := name_problem(value)):
            raise ValueError(problem)
        return value


class ServingTarget(_Model):
    """A whole ServingTarget manifest as read from a YAML file."""

    # API_VERSION and KIND (a type annotation cannot name a constant; a test compares)
    api_version: Literal["rooftop.dev/v1alpha1"]
    kind: Literal["ServingTarget"]
    metadata: Metadata
    spec: ServingTargetSpec


# ---- status: the operator reads and writes it through these models, which also
# generate the CRD's status schema (one source for both) ----


class PredictedLatency(_Model):
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    output_tok_s: float | None = None
    prefix_hit_ratio: float | None = Field(
        default=None,
        description="Predicted share 0..1 of prompt tokens found in vLLM's prefix cache "
        "(absent: no prefix reuse stated or observed).",
    )


class _EngineStatus(_Model):
    """One engine shape at its scale: what ``status.plan`` and each of its pools keep."""

    gpu: str
    tp: int
    replicas: int
    max_num_seqs: int
    weight_dtype: str
    kv_dtype: str
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = Field(
        default=None,
        description="The share of GPU memory vLLM may use (--gpu-memory-utilization).",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        description="vLLM --max-num-batched-tokens, the prefill chunk: the most tokens one "
        "engine step takes, so a longer prompt is prefilled over several steps (absent: "
        "8192).",
    )
    checkpoint: str | None = Field(default=None, description="The weights vLLM loads.")
    speculative_config: str | None = Field(
        default=None,
        max_length=4096,
        description="vLLM --speculative-config: the drafter and the draft length per batch "
        "size (absent: no speculative decoding).",
    )
    measured_acceptance: float | None = Field(
        default=None,
        gt=0,
        le=0.99,
        description="The per-token draft acceptance the feedback loop measured and planned "
        "the target again with (absent: spec.workload.acceptanceRate, or the drafter's "
        "published figure).",
    )
    session_affinity: Literal["ClientIP"] | None = Field(
        default=None,
        description="The Service's sessionAffinity, where the planner chose it: it keeps "
        "each session on one replica, whose prefix cache holds its history.",
    )
    predicted: PredictedLatency = Field(default_factory=PredictedLatency)
    usd_per_hour: float
    summary: str | None = None


class MeasuredLengths(_Model):
    """A served length distribution the loop planned the target with, tokens."""

    mean: float = Field(ge=1, le=10_000_000, description="Mean tokens.")
    p10: float = Field(ge=1, le=10_000_000, description="p10 tokens.")
    p50: float = Field(ge=1, le=10_000_000, description="Median tokens.")
    p90: float = Field(ge=1, le=10_000_000, description="p90 tokens.")
    p99: float = Field(ge=1, le=10_000_000, description="p99 tokens.")


class MeasuredWorkload(_Model):
    """The prompt and output lengths the feedback loop measured and planned the whole
    target again with, in place of spec.workload's."""

    prompt_tokens: MeasuredLengths = Field(description="Prompt (input) lengths served.")
    output_tokens: MeasuredLengths = Field(description="Output lengths served.")


class PoolStatus(_EngineStatus):
    """One GPU type's pool of a mixed fleet, as stored in ``status.plan.pools``."""


class PlanStatus(_EngineStatus):
    """The chosen plan as stored in ``status.plan``. A fleet of several GPU types keeps
    each pool in ``pools``; the plan's own fields are then the pool that sizes the fleet
    (the least capacity per pod) at the fleet's pod count and cost."""

    pools: list[PoolStatus] | None = Field(
        default=None,
        description="A mixed fleet's pools, one Deployment each (absent: one GPU type).",
    )
    measured_workload: MeasuredWorkload | None = Field(
        default=None,
        description="The served prompt and output lengths the feedback loop measured and "
        "planned the target again with, where they differ from spec.workload's beyond "
        "their noise (absent: planned with spec.workload's).",
    )


class ObservedLengths(_Model):
    """A served length distribution, tokens, to two significant figures."""

    mean: float = Field(description="Mean tokens.")
    p50: float = Field(description="Median tokens.")
    p90: float = Field(description="p90 tokens.")
    p99: float = Field(description="p99 tokens.")


class ObservedWorkload(_Model):
    """The lengths the loop plans with: those served over the last 15 minutes."""

    prompt_tokens: ObservedLengths = Field(description="Prompt (input) lengths served.")
    output_tokens: ObservedLengths = Field(description="Output lengths served.")
    requests: int | None = Field(
        default=None,
        ge=0,
        description="Requests finished over the last 15 minutes: the sample the lengths "
        "are read from. A length figure is rewritten when it moves beyond its noise, "
        "which grows as fewer requests lie beyond it (a p99 rests on a hundredth of them).",
    )
    arrival_dispersion: float | None = Field(
        default=None,
        description="The variance of the requests finished per 15-second interval over "
        "their mean, to two significant figures (1: independent arrivals): the "
        "burstiness the planner holds capacity for, as spec.workload.arrivalDispersion.",
    )


class ObservedStatus(_Model):
    """What the feedback loop measured (Prometheus)."""

    tpot_ms: float | None = None
    ttft_ms: float | None = None
    requests_per_second: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage_ratio: float | None = None
    prefix_cache_hit_ratio: float | None = Field(
        default=None,
        description="Share 0..1 of prompt tokens vLLM found in its prefix cache over the "
        "last 15 minutes (their prefill was skipped); the loop plans with it.",
    )
    accepted_draft_tokens: float | None = Field(
        default=None,
        description="Speculative decoding: draft tokens the engines accepted per "
        "verification step over the last 15 minutes (absent: the engines do not "
        "speculate). The loop solves the per-token acceptance from it and the draft "
        "lengths and plans with that.",
    )
    calibration_factor: float | None = None
    calibration_samples: int | None = Field(
        default=None,
        ge=0,
        description="Metrics windows the calibration factor has averaged; an operator "
        "restart resumes from it (a factor with few samples still moves fast).",
    )
    latency_trim: float | None = Field(
        default=None,
        description="The loop's latency trim: the multiplier on the rate the planner sizes "
        "for, learned from the share of requests within the TPOT bound; an operator "
        "restart resumes from it.",
    )
    workload: ObservedWorkload | None = Field(
        default=None,
        description="The served prompt and output lengths the loop plans with (absent "
        "until 100 requests finished within 15 minutes: spec.workload is used until then).",
    )
    metrics_state: str | None = Field(default=None, description="ok, missing, stale or nan.")
    time: str | None = Field(
        default=None,
        description="When these figures were written: the loop rewrites them only when one "
        "moves beyond its noise (5 %, or more for a figure drawn from few requests: about "
        "3·√(2/n) of it for n requests in the window, or the n served requests beyond a "
        "served length's quantile; and at least three times how far the figure moved "
        "from tick to tick over the last quarter hour), the metrics state changes or a "
        "condition does, so a steady target's status stays still.",
    )


# The stored form: the operator and the control law build the desired
# ``rooftop_api.conditions.Condition`` and ``conditions.merge`` turns it into this.
class ConditionStatus(_Model):
    """A standard Kubernetes condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


# Each writer in the operator reads status with ``read`` and writes back ``stored()``.
class ServingTargetStatus(_Model):
    """What the operator decided and observed: the plan, the loop's measurements, the
    engine's replicas and the conditions."""

    plan: PlanStatus | None = None
    observed: ObservedStatus | None = None
    conditions: list[ConditionStatus] | None = None
    observed_generation: int | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    gpu: str | None = Field(default=None, description="Planned GPU id (printer column).")
    slo: str | None = Field(default=None, description="SLO in words (printer column).")
    ready: str | None = Field(default=None, description="Ready condition (printer column).")

    @classmethod
    def read(cls, stored: Mapping[str, Any] | None) -> ServingTargetStatus:
        """``status`` as the API server stores it (camelCase JSON).

        A section that does not validate (hand-edited, or from another version) reads as
        absent, so its writer writes it afresh; the other sections are kept.
        """
        raw = stored or {}
        try:
            return cls.model_validate(raw)
        except ValidationError:
            return cls.model_validate({k: v for k, v in raw.items() if _valid(cls, k, v)})

    def stored(self) -> dict[str, Any]:
        """The JSON the API server stores: camelCase, no nulls."""
        dumped: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return dumped


def _valid(model: type[BaseModel], key: str, value: Any) -> bool:
    """Whether ``{key: value}`` alone validates as ``model``."""
    try:
        model.model_validate({key: value})
    except ValidationError:
        return False
    return True
