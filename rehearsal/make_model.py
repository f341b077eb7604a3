"""A tiny Qwen3 model made here, with no hub: random weights, a tokenizer trained on local text, a chat template.

    python -m rehearsal.make_model OUT_DIR

Its output is gibberish; everything the serving path does with a real model
(config, safetensors, tokenizer, chat template) it does with this one.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from rehearsal.native import CACHE
from settings.project import ROOT

# Qwen3's architecture at toy size. max_position_embeddings covers the product's
# max_model_len (8192), which the rehearsal keeps.
CONFIG: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL = [END_OF_TEXT, IM_START, IM_END]
# Qwen3's think tokens: added tokens, not special ones, as in Qwen3's tokenizer (ids 151667 and 151668 there).
# vLLM's qwen3 reasoning parser looks them up in the vocabulary.
THINK_START, THINK_END = "<think>", "</think>"
THINK = [THINK_START, THINK_END]
# ChatML turns, then Qwen3's own generation prompt, verbatim from the chat_template of Qwen/Qwen3-8B's
# tokenizer_config.json (https://huggingface.co/Qwen/Qwen3-8B/blob/main/tokenizer_config.json): thinking unless the
# request's chat_template_kwargs sets enable_thinking false, which closes an empty think block in the prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
)


def corpus() -> list[str]:
    """Local text to train the tokenizer on: this repository's own prose and code."""
    files = sorted([*ROOT.glob("*.md"), *ROOT.glob("*/*.py"), *ROOT.glob("serve_config/*.yaml")])
    return [line for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


def make_tokenizer() -> Any:
    """The tiny model's tokenizer (a transformers PreTrainedTokenizerFast), its chat template set."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        # Room for the think tokens, added after training: every id stays inside the model's vocab_size.
        vocab_size=CONFIG["vocab_size"] - len(THINK),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in THINK])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make(out: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    fast = make_tokenizer()
    fast.save_pretrained(out)

    torch.manual_seed(0)
    settings: dict[str, Any] = {
        **CONFIG,
        "eos_token_id": fast.convert_tokens_to_ids(IM_END),
        "pad_token_id": fast.convert_tokens_to_ids(END_OF_TEXT),
        "bos_token_id": None,
        "torch_dtype": "bfloat16",
    }
    model: Any = Qwen3ForCausalLM(Qwen3Config(**settings))
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


def made(out: Path, cache: Path = CACHE) -> Path:
    """make()'s model, copied to out from the rehearsal's cache: made once for what makes it (this module and its
    corpus), so the cases of one run share it and each still gets a copy of its own."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for line in corpus():
        digest.update(line.encode() + b"\n")
    cached = cache / f"model-{digest.hexdigest()[:16]}"
    if not (cached / "model.safetensors").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        for stale in cache.glob("model-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=cache, prefix="staging-"))
        make(staging)
        staging.rename(cached)
    shutil.copytree(cached, out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = make(Path(args[0]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
