"""The project's character tokenizer: a real `PreTrainedTokenizerFast`, built locally.

It saves with `save_pretrained` and loads with `AutoTokenizer.from_pretrained` like any hub
tokenizer, so the same loading code serves tiny CPU runs and real checkpoints. One token per
character keeps arithmetic tasks learnable by a ~1M-parameter model.
"""

from __future__ import annotations

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]
# model.tokenizer=char_tools appends these after CHARS (existing ids stay as they are): one token per
# tool-call marker, so a backend can stop on `</tool_call>` by id (Qwen3's hermes-style markers).
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHARS = list("0123456789+-*/=()<>[].,:;?! \n") + [chr(c) for c in range(ord("a"), ord("z") + 1)]

# Qwen-style chat markup over the character vocabulary.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same markup with a system line listing the tools (data.tool_key) and tool results as user turns
# wrapped in <tool_response>, as Qwen3's template renders them.
TOOLS_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools: {% for t in tools %}{{ t['function']['name'] if t['function'] is defined "
    "else t['name'] }}{% if not loop.last %}, {% endif %}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>{{ m['content'] }}"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_char_tokenizer(tools: bool = False):
    """tools=True (model.tokenizer=char_tools): the same vocabulary plus TOOL_TOKENS at the end."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = SPECIAL_TOKENS + (TOOL_TOKENS if tools else [])
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS + (TOOL_TOKENS if tools else []))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    core.add_special_tokens(specials)
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, additional_special_tokens=[t for t in specials if t not in (PAD, EOS)]
    )
    tok.chat_template = TOOLS_CHAT_TEMPLATE if tools else CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok
