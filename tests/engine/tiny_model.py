"""Write a tiny Llama-architecture checkpoint that the real vLLM can serve, offline.

Why: the real-engine tests must not download anything, yet vLLM needs a model directory
in Hugging Face layout (config.json, safetensors weights, tokenizer with a chat
template). This builds one in a second from fixed seeds: random weights (the answers
are gibberish; the tests check latency metrics, not text) and a byte-level BPE
tokenizer trained on a few sentences, so any prompt encodes. Under 1 MB.

The vocabulary is 4096 tokens, not a few hundred: ``rooftop load`` sends prompts as
token ids 1000, 1001, ... (one per prompt token), so every id below 1000 + the context
length must exist; the tokenizer is padded with unreachable tokens up to the model's
vocabulary so every id the model samples also decodes.

Run with the vLLM venv's python (it has torch, transformers and tokenizers; the dev
venv does not): ``python tests/engine/tiny_model.py OUT_DIR``. Prints OUT_DIR.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# The planner reads the same shape from spec.modelConfig (Hugging Face config.json keys).
CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    # head_dim 32: the smallest vLLM's CPU attention supports (16 fails at the first step)
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,  # one 4096 x 64 matrix: keeps the file under 1 MB
}
SPECIAL = {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Serving large language models to a latency target at the lowest cost.",
    "Tokens per second, time to first token and time per output token.",
    "Kubernetes schedules pods onto nodes with GPUs; the operator plans replicas.",
    "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor",
]


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk"]))
    # Byte-level: every string maps to tokens, so arbitrary load-generator prompts work.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok = pad_vocabulary(tok, CONFIG["vocab_size"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL["bos"],
        eos_token=SPECIAL["eos"],
        unk_token=SPECIAL["unk"],
        model_max_length=CONFIG["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def pad_vocabulary(tok: Any, size: int) -> Any:
    """The trained BPE plus unreachable letter-combination tokens up to ``size``: no merge
    produces them, so encoding is unchanged, but each id decodes to plain text."""
    import itertools
    import json
    import string

    from tokenizers import Tokenizer

    doc = json.loads(tok.to_str())
    vocab: dict[str, int] = doc["model"]["vocab"]
    words = (
        "".join(w) for n in (2, 3) for w in itertools.product(string.ascii_lowercase, repeat=n)
    )
    for word in words:
        if len(vocab) >= size:
            break
        vocab.setdefault(word, len(vocab))
    assert len(vocab) == size, len(vocab)
    return Tokenizer.from_str(json.dumps(doc))


def write_model(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    ids = {"bos_token_id": 0, "eos_token_id": 1}  # the order of SPECIAL in the vocab
    config = LlamaConfig(**CONFIG, **ids, torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out)
    write_model(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
