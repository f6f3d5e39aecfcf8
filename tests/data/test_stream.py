"""data.streaming, data.num_workers and Hugging Face datasets at scale: order, resume, workers, memory, errors.

Order against the in-memory source (data/stream.py says why a buffer smaller than the data set cannot
give the in-memory permutation): equal with a buffer that holds the file or with shuffling off; with a
smaller buffer, a permutation per epoch in which no prompt moves more than the buffer's size earlier.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import pickle
import time
from pathlib import Path

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.config.datafiles import resolve
from slime_hydra.data.dataset import Prompt, load_prompts
from slime_hydra.data.readers import LocalReader, Pending, Prep
from slime_hydra.data.rows import RowKeys
from slime_hydra.data.source import PromptSource
from slime_hydra.data.stream import StreamingPromptSource, streaming_source
from slime_hydra.data.workers import WorkerReader
from slime_hydra.errors import ConfigError, DataError
from slime_hydra.models.tokenizer import build_char_tokenizer
from tests.support.runs import FAST, run_cli

TOK = build_char_tokenizer()
KEYS = RowKeys("prompt", "label")
BAD = ['{"prompt": 7, "label": "1"}', "{not json", '{"prompt": "1+1="}']  # a number, malformed, no label


def rows(n: int, start: int = 0) -> list[str]:
    return [json.dumps({"prompt": f"{a}+{a % 7}=", "label": str(a + a % 7)}) for a in range(start, start + n)]


def write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def shards(tmp_path) -> str:
    """Three jsonl shards (a glob) of 140 rows: three bad rows, a blank line, and two prompts of 11+ characters."""
    a = rows(60)
    a[10:10] = [BAD[0], ""]
    b = rows(40, 60) + [json.dumps({"prompt": "1234567+89=", "label": "x"}), BAD[1]]
    c = [json.dumps({"prompt": "9999999+99=", "label": "y"})] + rows(34, 100) + [BAD[2]]
    for name, lines in (("a", a), ("b", b), ("c", c)):
        write(tmp_path / f"part-{name}.jsonl", lines)
    return str(tmp_path / "part-*.jsonl")


def stream(spec: str, buffer: int, seed: int = 3, shuffle: bool = True, workers: int = 0, block_rows: int = 16,
           max_len=None, on_bad_row: str = "skip", tokenizer=TOK, timeout_s: float = 60,
           driver_reads: bool = True) -> StreamingPromptSource:
    files, problems = resolve(spec)
    assert not problems
    prep = Prep(KEYS, tokenizer, False, max_len)
    opener = (functools.partial(WorkerReader, files, prep, num_workers=workers, timeout_s=timeout_s, block_rows=block_rows,
                                driver_reads=driver_reads)
              if workers else functools.partial(LocalReader, files, prep, block_rows=block_rows))
    return StreamingPromptSource(opener, 1, shuffle, seed, buffer, on_bad_row)


def served(source, n: int) -> list[tuple]:
    return [(g[0].prompt, tuple(g[0].prompt_tokens), g[0].label, g[0].group_index) for g in source.next_groups(n)]


@pytest.mark.parametrize("shuffle", [True, False])
def test_same_order_as_in_memory_when_the_buffer_holds_the_data(shards, shuffle):
    mem = load_prompts(shards, TOK, "prompt", "label", max_prompt_len=10, on_bad_row="skip")
    assert len(mem) == 134 and mem.skipped_rows == 3  # 140 rows - 3 bad - 2 too long - ... (and a blank line)
    src = stream(shards, buffer=134, shuffle=shuffle, max_len=10)
    # three epochs and a half: the same prompts, tokens, labels and group indices in the same order
    assert served(src, 470) == served(PromptSource(mem, 1, shuffle, 3), 470)
    assert src.skipped_rows == 3 and src.epoch == 3


def test_a_smaller_buffer_gives_a_deterministic_bounded_shuffle(shards):
    files = [p["prompt"] for f in sorted(Path(shards).parent.glob("part-*.jsonl")) for p in map(json.loads, [
        line for line in open(f) if line.strip() and line.strip() not in BAD])]
    a, b = stream(shards, buffer=16), stream(shards, buffer=16)
    epochs = [[p for p, *_ in served(a, len(files))] for _ in range(3)]
    assert [[p for p, *_ in served(b, len(files))] for _ in range(3)] == epochs  # a pure function of the seed
    for order in epochs:
        assert sorted(order) == sorted(files)  # every prompt once per epoch
        assert all(order.index(p) >= i - 16 for i, p in enumerate(files))  # at most the buffer's size earlier
    assert epochs[0] != epochs[1] != epochs[2]  # a new shuffle each epoch
    assert [p for p, *_ in served(stream(shards, buffer=16, seed=4), len(files))] != epochs[0]


def test_workers_give_the_same_stream(shards):
    local = stream(shards, buffer=16)
    with_workers = stream(shards, buffer=16, workers=2, block_rows=7)
    try:
        assert served(with_workers, 300) == served(local, 300)
        assert with_workers.skipped_rows == local.skipped_rows == 3
    finally:
        with_workers.close()


@pytest.mark.parametrize("cut", [5, 100, 125, 136, 137, 200])  # windowed, draining, epoch end, the next epoch
def test_resume_mid_epoch_serves_what_an_uninterrupted_run_serves(shards, cut):
    full = stream(shards, buffer=16)
    interrupted = stream(shards, buffer=16)
    served(interrupted, cut)
    state = pickle.loads(pickle.dumps(interrupted.state_dict()))  # what the checkpoint keeps
    resumed = stream(shards, buffer=16, workers=2 if cut == 100 else 0, block_rows=5)  # other readers, same stream
    try:
        resumed.load_state_dict(state)
        assert served(full, cut + 150)[cut:] == served(resumed, 150)
        assert resumed.skipped_rows == full.skipped_rows
    finally:
        resumed.close()


def test_resume_refuses_a_checkpoint_of_the_other_source(shards):
    mem = PromptSource(load_prompts(shards, TOK, "prompt", "label", on_bad_row="skip"), 1, True, 3)
    with pytest.raises(DataError, match="written with data.streaming=false; resume it with data.streaming=false"):
        stream(shards, buffer=16).load_state_dict(mem.state_dict())


@pytest.mark.integration
def test_memory_holds_the_buffer_and_one_block_over_200k_rows(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for a in range(200_000):
            f.write(f'{{"prompt": "{a}+1=", "label": "{a + 1}"}}\n')
    gc.collect()
    before = sum(isinstance(o, (Prompt, Pending)) for o in gc.get_objects())
    src = stream(str(path), buffer=1000, block_rows=512)
    held = []
    for i in range(200):
        src.next_groups(1000)  # the groups are dropped at once, as the loop trains on them
        if i % 40 == 39:
            gc.collect()
            held.append(sum(isinstance(o, (Prompt, Pending)) for o in gc.get_objects()) - before)
    assert src.epoch == 0 and src.offset == 200_000
    # the buffer (1000) and at most one block of events (512) are alive, whatever the position in the file
    assert max(held) <= 1000 + 512 + 8, held


def test_bad_rows_stop_with_the_in_memory_words(shards):
    with pytest.raises(DataError) as mem:
        load_prompts(shards, TOK, "prompt", "label")
    with pytest.raises(DataError) as streamed:
        served(stream(shards, buffer=16, on_bad_row="error"), 50)
    first = str(streamed.value).splitlines()[1].strip()
    assert first.startswith(str(Path(shards).parent / "part-a.jsonl:11: 'prompt' (data.input_key) is a number (7)"))
    assert first in str(mem.value)
    assert "set data.on_bad_row=skip" in str(streamed.value)


class SlowTokenizer:
    """A tokenizer (picklable into a worker) that takes `seconds` per call, or ends its process."""

    is_fast = False

    def __init__(self, seconds: float = 0.0, exit_code=None):
        self.seconds, self.exit_code = seconds, exit_code

    def __call__(self, texts, add_special_tokens=False):
        if self.exit_code is not None:
            os._exit(self.exit_code)
        time.sleep(self.seconds)
        return {"input_ids": [[ord(c) for c in t] for t in texts]}


class CountingTokenizer(SlowTokenizer):
    """Counts the texts it tokenizes in this process; `start_s`: a copy unpickled in a worker sleeps that long first
    (a worker slow to start)."""

    def __init__(self, start_s: float = 0.0):
        super().__init__()
        self.start_s, self.texts = start_s, 0

    def __call__(self, texts, add_special_tokens=False):
        self.texts += len(texts)
        return super().__call__(texts)

    def __reduce__(self):
        return _started_tokenizer, (self.start_s,)


def _started_tokenizer(start_s: float) -> CountingTokenizer:
    time.sleep(start_s)
    return CountingTokenizer()


def test_the_first_batch_tokenizes_the_batch_not_the_buffer(shards):
    """Without data.rollout_max_prompt_len the buffer fills with checked rows; the template and the tokenizer run on
    the prompts served, once each; the stream is the one that tokenizes every row as it is read."""
    deferred, eager = CountingTokenizer(), CountingTokenizer()
    src = stream(shards, buffer=64, tokenizer=deferred)
    first = served(src, 4)
    assert deferred.texts == 4  # 68+ rows read, 4 tokenized
    dropping = stream(shards, buffer=64, tokenizer=eager, max_len=10**6)  # a limit no prompt reaches: read = tokenized
    assert served(dropping, 4) == first and eager.texts >= 68
    assert served(src, 400) == served(dropping, 400)  # three epochs on
    assert deferred.texts == 404


def test_chat_rows_deferred_equal_the_in_memory_prompts(tmp_path):
    chat = [json.dumps({"prompt": [{"role": "user", "content": f"{a}+{a % 5}="}], "label": str(a + a % 5)}) for a in range(90)]
    path = write(tmp_path / "chat.jsonl", chat)
    mem = load_prompts(path, TOK, "prompt", "label", apply_chat_template=True)
    files, _ = resolve(path)
    for workers in (0, 2):
        src = streaming_source(files, Prep(KEYS, TOK, True), 1, True, 3, 90, "error", workers, 60)
        try:
            assert served(src, 200) == served(PromptSource(mem, 1, True, 3), 200)
        finally:
            src.close()


def test_the_driver_reads_while_the_workers_start(shards):
    """Workers that take 600 s to start (unpickling their tokenizer) hold nothing up: the driver reads every block
    itself, without waiting for them, and serves the stream num_workers=0 serves."""
    src = stream(shards, buffer=16, workers=2, tokenizer=CountingTokenizer(start_s=600), timeout_s=600)
    try:
        assert served(src, 300) == served(stream(shards, buffer=16, tokenizer=CountingTokenizer()), 300)
        assert src.reader.read_by_driver == src.reader.next_index > 0
    finally:
        src.close()


@pytest.mark.integration
def test_workers_make_the_rows_the_driver_deferred(shards):
    """The driver reads the first batch's blocks (the workers take 2 s to start) with their rows deferred; once
    started, the workers make those rows too, and the driver then tokenizes nothing it serves while the workers
    are ahead."""
    tok = CountingTokenizer(start_s=2)
    src = stream(shards, buffer=16, workers=2, tokenizer=tok, block_rows=8)
    try:
        first = served(src, 1)
        reader = src.reader
        assert reader.read_by_driver >= 3 and tok.texts == 1  # 17+ rows read by the driver, one served
        deadline = time.monotonic() + 600  # a spawned worker imports this module first: seconds, a minute on a busy box
        while reader.waiting and time.monotonic() < deadline:  # the workers' queues fill, then they make the rest
            reader._take_made()
            time.sleep(0.05)
        assert not reader.waiting
        rest = served(src, 40)  # the buffer's rows and 40 new ones: the queues hold 2 x 4 blocks of 8 rows
        assert tok.texts == 1  # every prompt served since came made from a worker
        rest += served(src, 259)  # faster than the workers: the driver reads (and makes) some itself
        assert first + rest == served(stream(shards, buffer=16, tokenizer=CountingTokenizer()), 300)
    finally:
        src.close()


@pytest.mark.integration
def test_a_stalled_worker_and_a_dead_worker_stop_with_the_key_and_the_fix(shards):
    # the workers read every block (by default the driver reads the blocks no worker has taken yet: maybe all)
    stalled = stream(shards, buffer=16, workers=1, tokenizer=SlowTokenizer(seconds=600), timeout_s=3, driver_reads=False)
    with pytest.raises(DataError, match=r"data worker 0 \(pid \d+\) sent nothing for 3 s \(data.worker_timeout_s\) while "
                                        r"reading block 0 .* raise data.worker_timeout_s, or set data.num_workers=0"):
        served(stalled, 1)
    assert not any(p.is_alive() for p in stalled.reader.procs) if stalled.reader else True
    dead = stream(shards, buffer=16, workers=2, tokenizer=SlowTokenizer(exit_code=3), timeout_s=60, driver_reads=False)
    with pytest.raises(DataError, match=r"data worker 0 \(pid \d+\) died with exit code 3 before sending block 0"):
        served(dead, 1)
    # the driver reading the blocks itself: a worker silent for data.worker_timeout_s still stops the run
    silent = stream(shards, buffer=16, workers=1, tokenizer=CountingTokenizer(start_s=600), timeout_s=1)
    deadline = time.monotonic() + 600
    with pytest.raises(DataError, match=r"data worker 0 \(pid \d+\) sent nothing for 1 s \(data.worker_timeout_s\) while the "
                                        r"driver read its blocks .* raise data.worker_timeout_s"):
        while time.monotonic() < deadline:
            served(silent, 16)


def test_hugging_face_dataset_directory_and_arrow_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    lines = [json.loads(x) for x in rows(50)]
    lines[3]["metadata"] = {"source": "hf"}
    ds = datasets.Dataset.from_list([{"question": r["prompt"], "answer": r["label"], "metadata": r.get("metadata")}
                                     for r in lines])
    ds.save_to_disk(str(tmp_path / "hf"))
    mem = load_prompts(str(tmp_path / "hf"), TOK, "question", "answer")
    assert [(p.prompt, p.label) for p in mem] == [(r["prompt"], r["label"]) for r in lines]
    assert mem[3].metadata == {"source": "hf"} and mem[0].metadata == {}
    files, _ = resolve(str(tmp_path / "hf"))
    src = streaming_source(files, Prep(RowKeys("question", "answer"), TOK), 1, True, 3, 100, "error", 0, 60)
    assert served(src, 100) == served(PromptSource(mem, 1, True, 3), 100)
    (arrow,) = (tmp_path / "hf").glob("*.arrow")
    assert [p.prompt for p in load_prompts(str(arrow), TOK, "question", "answer")] == [p.prompt for p in mem]
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dd"))
    assert resolve(str(tmp_path / "dd"))[1] == [
        f"data.prompt_data={tmp_path / 'dd'} is a Hugging Face DatasetDict with splits ['train']; point data.prompt_data "
        f"at one split's directory, e.g. data.prompt_data={tmp_path / 'dd' / 'train'}"]


def test_parquet_resumes_inside_a_row_group(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    table = pa.Table.from_pylist([json.loads(x) for x in rows(300)])
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=64)
    full, cut = stream(str(tmp_path / "d.parquet"), buffer=16), stream(str(tmp_path / "d.parquet"), buffer=16)
    served(cut, 77)
    resumed = stream(str(tmp_path / "d.parquet"), buffer=16, block_rows=10)
    resumed.load_state_dict(cut.state_dict())
    assert served(full, 77 + 400)[77:] == served(resumed, 400)


@pytest.mark.parametrize("override,message", [
    ("data.shuffle_buffer_size=0", "data.shuffle_buffer_size=0 must be >= 1"),
    ("data.num_workers=2", "data.num_workers=2 reads ahead of the rollout, which only the streaming source does"),
    ("data.worker_timeout_s=0", "data.worker_timeout_s=0.0 must be > 0 (seconds)"),
    ("data.prompt_data=/nope/*.jsonl", "data.prompt_data=/nope/*.jsonl: the glob matches no file; fix the pattern"),
])
def test_bad_values_of_the_new_keys_name_the_key_and_the_fix(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        compose_run([override])


@pytest.mark.parametrize("override,refused", [
    ("cluster.backend=ray", "data.streaming=true does not support cluster.backend=ray"),
])
def test_streaming_refuses_what_it_cannot_do(override, refused):
    with pytest.raises(ConfigError, match=refused):
        compose_run(["data.streaming=true", override])


@pytest.mark.integration
def test_cli_resume_of_a_streaming_run_with_workers_serves_the_uninterrupted_prompts(workdir):
    """Four rollouts uninterrupted (checkpoints after 2 and 4), then rollouts 3-4 again from the first checkpoint,
    through the CLI: the same prompts in the same order (a 64-prompt shuffle buffer over 7900 prompts)."""
    common = ["logger=none", *FAST, "num_rollout=4", "data.streaming=true", "data.shuffle_buffer_size=64",
              "data.num_workers=1"]
    full = run_cli([*common, "save_interval=2", f"hydra.run.dir={workdir}/full", f"save_debug_rollout_data={workdir}/d_full"],
                   workdir)
    assert full.returncode == 0, full.stderr[-3000:]
    resumed = run_cli([*common, f"load={workdir}/full/checkpoints/rollout_000001", f"hydra.run.dir={workdir}/resumed",
                       f"save_debug_rollout_data={workdir}/d_resumed"], workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for rid in (2, 3):
        # line 1 of a dump is its header (data/rollout_dump.py)
        a = [(s["prompt"], s["index"]) for s in list(map(json.loads, open(workdir / "d_full" / f"rollout_{rid:06d}.jsonl")))[1:]]
        b = [(s["prompt"], s["index"]) for s in list(map(json.loads, open(workdir / "d_resumed" / f"rollout_{rid:06d}.jsonl")))[1:]]
        assert a == b and len(a) == 32
    assert not (workdir / "d_resumed" / "rollout_000001.jsonl").exists()
