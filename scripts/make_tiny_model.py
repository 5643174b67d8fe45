"""Make the tiny random Llama used by the tests, locally, with no download.

hidden 256, 4 heads (head_dim 64: the CPU attention backend rejects head_dim 16),
2 KV heads, 2 layers, intermediate 512, a byte-level BPE vocabulary of 512 trained
with `tokenizers` on a few sentences. KV bytes per token = 2 layers x 2 KV heads x 64
x 2 (K and V) x 2 bytes = 1,024 B (docs/vllm-facts.md, "The tiny test model").

Usage: python scripts/make_tiny_model.py OUT_DIR   (run with .venv-vllm's python)
"""
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A dynamometer measures the power of an engine under load.",
    "vLLM serves large language models with continuous batching and paged attention.",
    "How many concurrent users can this rig serve before latency breaks?",
    "Throughput rises with concurrency until the batch is full, then requests queue.",
    "0123456789 !?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`",
] * 20


def main(out: str) -> None:
    tmp = out + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    fast.save_pretrained(tmp)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp)
    if os.path.exists(out):
        import shutil
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"tiny model written to {out} (vocab {len(fast)})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/tiny-llama")
