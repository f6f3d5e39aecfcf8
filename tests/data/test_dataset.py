"""Bad input exits with code 2 and one clear message (file:line or key, and the fix); data loads as shipped."""

from __future__ import annotations

import json

import pytest

from slime_hydra.data import arithmetic
from slime_hydra.data.dataset import load_prompts
from slime_hydra.data.source import PromptSource
from slime_hydra.errors import DataError
from slime_hydra.models.tokenizer import build_char_tokenizer
from tests.support.runs import ROOT, run_cli

ASSETS = ROOT / "slime_hydra" / "assets"


def test_shipped_data_is_what_the_generator_writes(tmp_path):
    arithmetic.generate(tmp_path)
    for name in ("addition", "subtraction"):
        for split in ("train", "test"):
            assert (tmp_path / name / f"{split}.jsonl").read_bytes() == (ASSETS / name / f"{split}.jsonl").read_bytes()


def test_addition_split_is_disjoint_and_correct():
    train = [json.loads(line) for line in open(ASSETS / "addition" / "train.jsonl")]
    test = [json.loads(line) for line in open(ASSETS / "addition" / "test.jsonl")]
    assert (len(train), len(test)) == (7900, 200)  # 90 * 90 two-digit pairs
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    a, b = test[0]["prompt"].rstrip("=").split("+")
    assert int(test[0]["label"]) == int(a) + int(b)


def test_chat_prompts_use_the_chat_template(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+2="}], "label": "3"}) + "\n")
    tok = build_char_tokenizer()
    (p,) = load_prompts(str(path), tok, "prompt", "label", apply_chat_template=True)
    assert p.text == "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(p.tokens) == p.text and p.label == "3"
    with pytest.raises(DataError, match="apply_chat_template=true"):
        load_prompts(str(path), tok, "prompt", "label", apply_chat_template=False)


def test_source_serves_groups_and_resumes_exactly():
    tok = build_char_tokenizer()
    prompts = load_prompts(str(ASSETS / "addition" / "test.jsonl"), tok, "prompt", "label")
    a = PromptSource(prompts, n_samples_per_prompt=3, shuffle=True, seed=7)
    first = a.next_groups(150)
    assert [s.index for s in first[1]] == [3, 4, 5] and {s.group_index for s in first[1]} == {1}
    state = a.state_dict()
    rest_a = [g[0].prompt for g in a.next_groups(120)]  # crosses into epoch 1 (200 prompts)
    b = PromptSource(prompts, n_samples_per_prompt=3, shuffle=True, seed=7)
    b.load_state_dict(state)
    assert [g[0].prompt for g in b.next_groups(120)] == rest_a
    assert a.epoch == 1


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("content,expected", [
    ('{"prompt": "1+1=", "label": "2"}\n{"prompt": "1+2=", "label": \n', "bad.jsonl:2: malformed JSON"),
    ('{"question": "1+1=", "label": "2"}\n', "bad.jsonl:1: missing key 'prompt' (data.input_key)"),
    ('{"prompt": "1+1=", "answer": "2"}\n', "bad.jsonl:1: missing key 'label' (data.label_key)"),
])
def test_bad_data_lines_name_file_line_and_key(tmp_path, content, expected):
    path = write(tmp_path / "bad.jsonl", content)
    with pytest.raises(DataError) as info:
        load_prompts(str(path), build_char_tokenizer(), "prompt", "label")
    assert expected in str(info.value)


@pytest.mark.parametrize("kind", ["missing", "empty", "malformed", "missing_key", "no_prompt_data", "bad_group", "bad_batch"])
@pytest.mark.integration
def test_cli_bad_input_exits_2_with_one_clear_message(workdir, kind):
    bad = workdir / "bad.jsonl"
    args = {
        "missing": [f"data.prompt_data={workdir}/nope.jsonl"],
        "empty": [f"data.prompt_data={write(workdir / 'empty.jsonl', '')}"],
        "malformed": [f"data.prompt_data={write(bad, '{not json}' + chr(10))}"],
        "missing_key": [f"data.prompt_data={write(workdir / 'nokey.jsonl', json.dumps({'q': '1', 'label': '1'}) + chr(10))}"],
        "no_prompt_data": ["data.prompt_data=null"],
        "bad_group": ["model=qwen9"],
        "bad_batch": ["train.global_batch_size=100"],
    }[kind]
    expected = {
        "missing": "file not found; set data.prompt_data",
        "empty": "the file is empty",
        "malformed": "bad.jsonl:1: malformed JSON",
        "missing_key": "nokey.jsonl:1: missing key 'prompt' (data.input_key); keys on this line: ['label', 'q']; set data.input_key",
        "no_prompt_data": "data.prompt_data is not set",
        "bad_group": "model=qwen9: no such option",
        "bad_batch": "not divisible by train.global_batch_size=100",
    }[kind]
    proc = run_cli(["logger=none", "warmstart=none", "num_rollout=1", *args], workdir)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert expected in proc.stderr


QWEN3_THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
                  "{% endif %}")  # the part of Qwen3's template that reads enable_thinking


@pytest.mark.parametrize("streaming", [False, True])
def test_chat_template_kwargs_reach_the_template(tmp_path, streaming):
    """data.apply_chat_template_kwargs (slime's --apply-chat-template-kwargs) go to the chat template of every prompt,
    loaded or streamed: enable_thinking=false gives Qwen3's empty think block."""
    from slime_hydra.app.inputs import load_data, stream_files
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.data.stream import read_head

    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n" for a in range(3)))
    tok = build_char_tokenizer()
    tok.chat_template = QWEN3_THINKING
    got = {}
    for kwargs in ((), ("+data.apply_chat_template_kwargs.enable_thinking=false",)):
        cfg = compose_run([f"data.prompt_data={path}", "data.apply_chat_template=true", f"data.streaming={streaming}",
                           *kwargs, "warmstart.steps=1", "warmstart.min_steps=0"])
        prompts = read_head(*stream_files(cfg, tok), 3, "error") if streaming else load_data(cfg, tok)
        got[bool(kwargs)] = [p.text for p in prompts]
    assert got[False][0] == "<|im_start|>user\n0+1=<|im_end|>\n<|im_start|>assistant\n"
    assert got[True] == [t + "<think>\n\n</think>\n\n" for t in got[False]]


def test_chat_template_kwargs_without_the_template_are_refused():
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.apply_chat_template_kwargs=\{'enable_thinking': False\} is given to the "
                                          r"chat template, which is off; set data.apply_chat_template=true"):
        compose_run(["+data.apply_chat_template_kwargs.enable_thinking=false"])
