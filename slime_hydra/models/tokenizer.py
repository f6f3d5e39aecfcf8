"""The project's character tokenizer: a real `PreTrainedTokenizerFast`, built locally.

It saves with `save_pretrained` and loads with `AutoTokenizer.from_pretrained` like any hub
tokenizer, so the same loading code serves tiny CPU runs and real checkpoints. One token per
character keeps arithmetic tasks learnable by a ~1M-parameter model.
"""

from __future__ import annotations

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]
CHARS = list("0123456789+-*/=()<>[].,:;?! \n") + [chr(c) for c in range(ord("a"), ord("z") + 1)]

# Qwen-style chat markup over the character vocabulary.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_char_tokenizer():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    core.add_special_tokens(SPECIAL_TOKENS)
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, additional_special_tokens=[IM_START, IM_END]
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok
