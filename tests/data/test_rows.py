"""Every row is checked as it loads: each bad kind names path:line, the key and the fix, all of a file's
problems together (a screenful and a count); data.on_bad_row=skip loads only the good rows and counts
the rest; through the real CLI bad data exits 2 without a traceback."""

from __future__ import annotations

import json
import logging

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.data.dataset import load_prompts
from slime_hydra.errors import ConfigError, DataError
from slime_hydra.models.tokenizer import build_char_tokenizer
from tests.support.runs import FAST, run_cli

TOK = build_char_tokenizer()
GOOD = json.dumps({"prompt": "1+1=", "label": "2"})


def write(path, lines: list[str | bytes]):
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def load(path, **kw):
    return load_prompts(str(path), TOK, "prompt", "label", **kw)


# each bad row sits on line 2, after a good one; `expected` is the start of its message after "bad.jsonl:2: "
BAD_ROWS = {
    # '{"prompt": "caf' is 15 bytes, so the latin-1 é (0xe9) is byte 16
    "non_utf8": (b'{"prompt": "caf\xe9", "label": "1"}', "not valid UTF-8 (byte 0xe9 at column 16); re-encode the file as UTF-8"),
    "invalid_json": ('{"prompt": "1+2=", "label": ', "malformed JSON (Expecting value at column 29); fix or remove this line"),
    "not_an_object": ('["1+2=", "3"]', "expected a JSON object per line, got a list"),
    "prompt_number": ('{"prompt": 12, "label": "3"}', "'prompt' (data.input_key) is a number (12); it must be a string or a list of"),
    "no_content": ('{"prompt": [{"role": "user"}], "label": "3"}',
                   "'prompt' message 0 (data.input_key) has no 'content'; give every message a string 'content'"),
    "role_number": ('{"prompt": [{"role": 1, "content": "1+2="}], "label": "3"}',
                    "'prompt' message 0 (data.input_key): 'role' is a number (1); it must be a string"),
    "message_string": ('{"prompt": ["1+2="], "label": "3"}', "'prompt' message 0 (data.input_key) is a string; each message must be an object"),
    "missing_label": ('{"prompt": "1+2=", "answer": "3"}',
                      "missing key 'label' (data.label_key); keys on this line: ['answer', 'prompt']; set data.label_key"),
    "null_label": ('{"prompt": "1+2=", "label": null}', "'label' (data.label_key) is null; the reward compares"),
    "metadata_list": ('{"prompt": "1+2=", "label": "3", "metadata": [1]}', "'metadata' (data.metadata_key) is a list; it must be an object"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_each_bad_row_kind_names_file_line_key_and_fix(tmp_path, kind):
    line, expected = BAD_ROWS[kind]
    path = write(tmp_path / "bad.jsonl", [GOOD, line, GOOD])
    with pytest.raises(DataError) as info:
        load(path, apply_chat_template=True)
    msg = str(info.value)
    assert f"data.prompt_data: 1 of 3 rows of {path} are bad; fix them, or set data.on_bad_row=skip" in msg
    assert f"{path}:2: {expected}" in msg
    assert msg.count(f"{path}:") == 1  # the good lines 1 and 3 are not named


def test_all_problems_of_a_file_come_together(tmp_path):
    # line 2: two problems in one row; line 4 (blank line 3 skipped): one
    path = write(tmp_path / "bad.jsonl", [GOOD, '{"prompt": 5, "answer": "1"}', "", '{"prompt": "2+2=", "label": [4]}'])
    with pytest.raises(DataError) as info:
        load(path)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("data.prompt_data: 2 of 3 rows")  # blank lines are not rows
    assert [x.split(": ")[0].strip() for x in lines[1:]] == [f"{path}:2", f"{path}:2", f"{path}:4"]
    assert "missing key 'label'" in lines[1] and "is a number (5)" in lines[2] and "is a list" in lines[3]


def test_more_than_a_screenful_shows_20_and_counts_the_rest(tmp_path):
    path = write(tmp_path / "bad.jsonl", [GOOD] + [json.dumps({"prompt": i, "label": "0"}) for i in range(25)])
    with pytest.raises(DataError) as info:
        load(path)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("data.prompt_data: 25 of 26 rows")
    assert len(lines) == 1 + 20 + 1
    assert lines[1].startswith(f"  {path}:2: ") and lines[20].startswith(f"  {path}:21: ")  # lines 2..21 shown
    assert lines[21] == "  ... and 5 more problems (25 in all)"  # lines 22..26


def test_skip_loads_only_the_good_rows_and_counts_the_rest(tmp_path, caplog):
    rows = [GOOD, BAD_ROWS["non_utf8"][0], json.dumps({"prompt": "2+3=", "label": 5}), BAD_ROWS["prompt_number"][0],
            BAD_ROWS["no_content"][0], BAD_ROWS["missing_label"][0]]
    path = write(tmp_path / "scraped.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        prompts = load(path, on_bad_row="skip", apply_chat_template=True)
    assert [(p.prompt, p.label) for p in prompts] == [("1+1=", "2"), ("2+3=", "5")]
    assert prompts.skipped_rows == 4  # lines 2, 4, 5, 6
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"skipped 4 bad rows of 6 in {path} (data.on_bad_row=skip), the first: {path}:2: not valid UTF-8" in warning
    assert f"{path}:4: 'prompt'" in warning and f"{path}:5: 'prompt' message 0" in warning and f"{path}:6:" not in warning


def test_skip_with_no_good_row_left_is_an_error(tmp_path):
    path = write(tmp_path / "bad.jsonl", [BAD_ROWS["prompt_number"][0]])
    with pytest.raises(DataError, match="holds no samples; every row is bad"):
        load(path, on_bad_row="skip")


def test_parquet_rows_are_checked_as_jsonl_lines_are(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "chat.parquet"
    prompts = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": None}], [{"role": "user", "content": "2+2="}]]
    pq.write_table(pa.table({"prompt": prompts, "label": ["2", "3", None]}), path)
    with pytest.raises(DataError) as info:
        load(path, apply_chat_template=True)
    msg = str(info.value)
    assert msg.startswith(f"data.prompt_data: 2 of 3 rows of {path} are bad")
    assert f"{path}:2: 'prompt' message 0 (data.input_key): 'content' is null; it must be a string" in msg
    assert f"{path}:3: 'label' (data.label_key) is null" in msg
    (p,) = load(path, apply_chat_template=True, on_bad_row="skip")
    assert p.text == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n" and p.label == "2"


def test_on_bad_row_accepts_only_error_or_skip():
    with pytest.raises(ConfigError, match=r"data.on_bad_row='drop' is not one of \['error', 'skip'\]"):
        compose_run(["data.on_bad_row=drop"])


def cli(workdir, *args):
    proc = run_cli(["logger=none", "warmstart=none", *args], workdir)
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc


@pytest.mark.integration
def test_cli_non_utf8_exits_2_with_file_line(workdir):
    train = write(workdir / "latin1.jsonl", [GOOD, BAD_ROWS["non_utf8"][0]])
    # num_epoch counts the rows in preflight, which reads the file too
    proc = cli(workdir, f"data.prompt_data={train}", "num_rollout=null", "num_epoch=1", "rollout.rollout_batch_size=1",
               "train.global_batch_size=8", "train.micro_batch_size=8")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{train}:2: not valid UTF-8 (byte 0xe9 at column 16)" in proc.stderr


def test_eval_files_are_checked_with_their_own_keys(tmp_path):
    from slime_hydra.app.inputs import build_eval_sets
    from slime_hydra.engine.steps import rollout_sampling

    held = write(tmp_path / "held.jsonl", [BAD_ROWS["no_content"][0], '{"prompt": "1+1=", "answer": "2"}'])
    cfg = compose_run(["data.apply_chat_template=true", f"+eval.eval_prompt_data.held={{path: '{held}', label_key: answer}}"])
    with pytest.raises(DataError) as info:
        build_eval_sets(cfg, TOK, rollout_sampling(cfg.rollout, (TOK.eos_token_id,)))
    msg = str(info.value)
    assert msg.startswith("eval.eval_prompt_data.held: 1 of 2 rows")
    assert f"{held}:1: 'prompt' message 0 (eval.eval_prompt_data.held.input_key) has no 'content'" in msg
    assert f"{held}:1: missing key 'answer'" in msg  # the eval set's own label_key, not data.label_key


@pytest.mark.integration
def test_cli_skip_trains_on_the_good_rows_and_logs_the_count(workdir):
    rows = [json.dumps({"prompt": f"{a}+{a}=", "label": str(2 * a)}) for a in range(10, 18)]
    path = write(workdir / "scraped.jsonl", rows[:4] + [BAD_ROWS["prompt_number"][0], BAD_ROWS["non_utf8"][0]] + rows[4:])
    proc = cli(workdir, *FAST, f"data.prompt_data={path}", "data.on_bad_row=skip", "num_rollout=1", "eval=none",
               f"hydra.run.dir={workdir}/run", f"save_debug_rollout_data={workdir}/debug")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"skipped 2 bad rows of 10 in {path} (data.on_bad_row=skip), the first: {path}:5: 'prompt'" in proc.stdout + proc.stderr
    summary = json.loads((workdir / "run" / "summary.json").read_text())
    assert summary["data/skipped_rows"]["last"] == 2
    trained = [json.loads(x) for x in open(workdir / "debug" / "rollout_000000.jsonl")][1:]  # line 1: the dump's header
    # one rollout of 8 prompts × 4 samples is one epoch of exactly the 8 good rows
    assert sorted({s["prompt"] for s in trained}) == sorted(f"{a}+{a}=" for a in range(10, 18)) and len(trained) == 32


def test_shipped_eval_sets_keep_their_keys_when_the_training_data_uses_others(tmp_path):
    """A chat-format training file with data.input_key=question data.label_key=answer; the embedded
    eval set (prompt/label) names its own keys, so it still loads; an eval file that lacks them names its key
    and eval=none as the fixes."""
    from slime_hydra.app.inputs import build_eval_sets, load_data
    from slime_hydra.engine.steps import rollout_sampling

    train = write(tmp_path / "train.jsonl", ['{"question": "1+1=", "answer": "2"}', '{"question": "2+2=", "answer": "4"}'])
    cfg = compose_run([f"data.prompt_data={train}", "data.input_key=question", "data.label_key=answer"])
    assert [p.label for p in load_data(cfg, TOK)] == ["2", "4"]
    sets = build_eval_sets(cfg, TOK, rollout_sampling(cfg.rollout, (TOK.eos_token_id,)))
    assert len(sets["addition"].prompts) > 100  # the shipped held-out set, read with prompt/label
    held = write(tmp_path / "held.jsonl", ['{"q": "1+1=", "label": "2"}'])
    cfg = compose_run([f"+eval.eval_prompt_data.held={held}", "data.input_key=question"])
    with pytest.raises(DataError) as info:
        build_eval_sets(cfg, TOK, rollout_sampling(cfg.rollout, (TOK.eos_token_id,)))
    assert ("missing key 'question' (eval.eval_prompt_data.held.input_key); keys on this line: ['label', 'q']; set "
            "eval.eval_prompt_data.held.input_key to one of them (or eval=none to run without this eval set)") in str(info.value)


def test_a_chat_training_file_with_its_own_keys_leaves_the_eval_sets_their_own(tmp_path):
    """A new user's chat-format data: training rows read with data.input_key=question
    data.label_key=answer data.metadata_key=meta; the shipped eval set keeps prompt/label/metadata, a user's eval
    set names its own keys (unset ones inherit data.*), and a bad eval row names that eval set's key."""
    from slime_hydra.app.inputs import build_eval_sets, load_data
    from slime_hydra.engine.steps import rollout_sampling

    chat = [{"role": "user", "content": "1+1="}]
    train = write(tmp_path / "train.jsonl", [json.dumps({"question": chat, "answer": "2", "meta": {"src": "t"}})])
    held = write(tmp_path / "held.jsonl", [json.dumps({"prompt": "2+2=", "label": "4", "info": {"src": "h"}})])
    keys = [f"data.prompt_data={train}", "data.input_key=question", "data.label_key=answer", "data.metadata_key=meta",
            "data.apply_chat_template=true"]
    cfg = compose_run(keys + [f"+eval.eval_prompt_data.held={{path: '{held}', input_key: prompt, label_key: label, metadata_key: info}}"])
    assert [p.metadata for p in load_data(cfg, TOK)] == [{"src": "t"}]
    sets = build_eval_sets(cfg, TOK, rollout_sampling(cfg.rollout, (TOK.eos_token_id,)))
    assert len(sets["addition"].prompts) == 200 and sets["addition"].prompts[0].metadata == {}
    assert [(p.label, p.metadata) for p in sets["held"].prompts] == [("4", {"src": "h"})]
    bad = write(tmp_path / "bad.jsonl", [json.dumps({"prompt": "2+2=", "label": "4", "info": "h"})])
    cfg = compose_run(keys + [f"+eval.eval_prompt_data.held={{path: '{bad}', input_key: prompt, label_key: label, metadata_key: info}}"])
    with pytest.raises(DataError) as info:
        build_eval_sets(cfg, TOK, rollout_sampling(cfg.rollout, (TOK.eos_token_id,)))
    assert f"{bad}:1: 'info' (eval.eval_prompt_data.held.metadata_key) is a string; it must be an object" in str(info.value)


def long_line(path, size: int):
    """A file of a good row, one JSON row of `size` bytes (a prompt of spaces and digits), and a good row: written in
    pieces, never held whole."""
    head, tail = b'{"prompt": "', b'", "label": "1"}\n'
    with open(path, "wb") as f:
        f.write(GOOD.encode() + b"\n" + head)
        body, piece = size - len(head) - len(tail), b"1 " * (1 << 19)
        while body > 0:
            f.write(piece[:body])
            body -= len(piece)
        f.write(tail + GOOD.encode() + b"\n")
    return path


NESTED = '{"prompt": "1+1=", "label": "2", "metadata": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}"


def test_an_overlong_line_is_a_bad_row_read_no_further(tmp_path):
    import tracemalloc

    path = long_line(tmp_path / "long.jsonl", 50 << 20)  # one 50 MB line between two good ones
    tracemalloc.start()
    with pytest.raises(DataError) as info:
        load(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert f"{path}:2: the line is {50 << 20:,} bytes, over data.max_line_bytes={16 << 20:,} (read no further)" in str(info.value)
    assert peak < 40 << 20, peak  # the cap (16 MiB) plus a chunk, never the 50 MB line
    kept = load(path, on_bad_row="skip")
    assert len(kept) == 2 and kept.skipped_rows == 1
    short = long_line(tmp_path / "short.jsonl", 3000)
    with pytest.raises(DataError, match=f"{short}:2: the line is 3,000 bytes, over data.max_line_bytes=2,000"):
        load(short, max_line_bytes=2000)
    assert len(load(short, max_line_bytes=3000)) == 3  # within the cap: the line is a row like any other


def test_a_line_nested_too_deeply_is_a_bad_row(tmp_path):
    path = write(tmp_path / "deep.jsonl", [GOOD, NESTED, GOOD])
    with pytest.raises(DataError, match=rf"{path}:2: JSON nested too deeply to parse \(RecursionError\); flatten this row"):
        load(path)
    assert len(load(path, on_bad_row="skip")) == 2


def test_streamed_overlong_and_deep_lines_are_bad_rows_at_the_right_offsets(tmp_path):
    from slime_hydra.config.datafiles import DataFile
    from slime_hydra.data.readers import LocalReader, Prep
    from slime_hydra.data.rows import RowKeys

    path = long_line(tmp_path / "long.jsonl", 300_000)  # over the cap below; the nested line (200,054 bytes) is not
    with open(path, "ab") as f:
        f.write(NESTED.encode() + b"\n" + b'{"prompt": "2+2=", "label": "4"}\n')
    prep = Prep(RowKeys("prompt", "label"), TOK, max_line_bytes=250_000)
    reader = LocalReader([DataFile(str(path), "jsonl")], prep, block_rows=2)
    events = next(reader)[0] + next(reader)[0] + next(reader)[0]
    assert [e[0] for e in events] == ["ok", "bad", "ok", "bad", "ok"]
    assert events[1][1][0].startswith(f"{path}:2: the line is 300,000 bytes") and events[3][1][0].startswith(f"{path}:4: JSON nested")
    assert events[4][2] == (0, 5, path.stat().st_size)  # the byte offsets count the skipped lines whole: resume is exact


def test_the_prompt_limit_is_the_context_minus_the_response_and_longer_prompts_are_counted(tmp_path):
    cfg = compose_run([])
    assert cfg.data.rollout_max_prompt_len == 256 - 6  # model.max_position_embeddings - rollout.rollout_max_response_len
    with pytest.raises(ConfigError, match=r"data.rollout_max_prompt_len=251 is over the model's context 256 "
                                          r"\(model.max_position_embeddings\) - rollout.rollout_max_response_len=6 = 250"):
        compose_run(["data.rollout_max_prompt_len=251"])
    with pytest.raises(ConfigError, match="rollout.rollout_max_response_len=256 leaves no room for a prompt"):
        compose_run(["rollout.rollout_max_response_len=256"])
    path = write(tmp_path / "p.jsonl", [GOOD, json.dumps({"prompt": "1+" * 150 + "1=", "label": "151"}), GOOD])
    prompts = load(path, max_prompt_len=cfg.data.rollout_max_prompt_len)
    assert len(prompts) == 2 and prompts.overlong_rows == 1
