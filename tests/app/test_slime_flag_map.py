"""docs/slime_flags.md is the flag map's output, and the map is true: every flag of slime's arguments file (the list
shipped in slime_hydra/app/slime_arguments.json) has a row, every key it names is in the schema (or one of the
hook keys being added, listed as pending), and every default that differs from slime's says why."""

from __future__ import annotations

import re

from slime_hydra.app import slime_flag_map as fm
from tests.support.runs import ROOT

SLIME_SOURCE = '''
def reset_arg(parser, name, **kwargs): ...
def add(parser):
    reset_arg(parser, "--seed", type=int, default=1234)
    parser.add_argument("--colocate", action="store_true", default=False, help="h")
    parser.add_argument("--keep-old-actor", action="store_true")
    parser.add_argument("--disable-x-norm", action="store_false", dest="x_norm")
    parser.add_argument("--kwargs", type=json.loads, default="{}")
    parser.add_argument("--buffer-size", type=int, default=512 * 1024**2)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--fn", type=str, default=os.environ.get("FN"))
    parser.add_argument("--seed", type=int, default=1)
'''


def test_the_extractor_reads_names_defaults_and_megatron_redeclarations():
    flags = {f["flag"]: f for f in fm.extract(SLIME_SOURCE)}
    assert list(flags) == ["--seed", "--colocate", "--keep-old-actor", "--disable-x-norm", "--kwargs", "--buffer-size",
                           "--batch", "--fn"]  # the file's order; a name declared twice is taken once (the first)
    assert flags["--seed"] == {"flag": "--seed", "dest": "seed", "default": 1234, "megatron": True}
    assert [flags[n]["default"] for n in ("--colocate", "--keep-old-actor", "--kwargs", "--buffer-size", "--batch")] == \
        [False, False, {}, 536870912, fm.NOT_SET]  # store_true without a default is False; 512 * 2**20
    assert (flags["--disable-x-norm"]["dest"], flags["--disable-x-norm"]["default"]) == ("x_norm", True)
    assert flags["--fn"]["default"] == {"expression": "os.environ.get('FN')"}  # not evaluated: it is not a constant


def test_the_shipped_list_is_slimes_file_at_a_named_commit():
    doc = fm.load_flags()
    assert doc["source"] == "slime/utils/arguments.py" and re.fullmatch(r"[0-9a-f]{40}", doc["commit"])
    names = [f["flag"] for f in doc["flags"]]
    assert len(names) == len(set(names)) == 223
    megatron = {f["flag"] for f in doc["flags"] if f["megatron"]}
    assert {"--lr", "--seed", "--micro-batch-size", "--global-batch-size", "--wandb-project"} <= megatron
    assert {f["flag"]: f["default"] for f in doc["flags"]}["--kl-loss-type"] == "k1"


def test_every_flag_is_mapped_to_a_real_key_or_says_why_not():
    assert fm.problems(fm.load_flags()["flags"], fm.load_map(), fm.schema_defaults()) == []


def test_the_doc_is_the_scripts_output():
    assert (ROOT / "docs" / "slime_flags.md").read_text() == fm.document(), \
        "docs/slime_flags.md is stale: run `make slime-flags`"


def test_the_defaults_a_slime_user_copies_are_listed_with_their_reason():
    doc = fm.document()
    differ = doc[doc.index("## Defaults that differ"):doc.index("## Every flag")]
    rows = {line.split("|")[1].strip(" `"): line for line in differ.splitlines() if line.startswith("| `--")}
    for flag, slime, ours in [("--kl-loss-type", "'k1'", "low_var_kl"), ("--rollout-shuffle", "False", "true"),
                              ("--input-key", "'input'", "prompt"), ("--n-samples-per-prompt", "1", "8"),
                              ("--rollout-health-check-first-wait", "0", "600.0")]:
        cells = [c.strip() for c in rows[flag].split("|")[1:-1]]
        assert cells[1] == f"`{slime}`" and cells[3] == f"`{ours}`" and len(cells[4]) > 20, rows[flag]


def test_the_checks_catch_a_missing_row_a_wrong_key_and_an_unexplained_default():
    flags = [{"flag": "--a", "dest": "a", "default": 1, "megatron": False},
             {"flag": "--b", "dest": "b", "default": None, "megatron": False},
             {"flag": "--c", "dest": "c", "default": "k1", "megatron": False},
             {"flag": "--d", "dest": "d", "default": 0, "megatron": False},
             {"flag": "--e", "dest": "e", "default": None, "megatron": False}]
    ours = {"x.a": 1.0, "x.c": "low_var_kl", "x.d": 0.0, "x.real": {}}
    fmap = {"pending": ["x.hook", "x.real"],
            "flags": {"--a": "x.a",  # 1 == 1.0: the same
                      "--b": "x.nothing",
                      "--c": "x.c",
                      "--d": {"key": "x.d", "why_default": "stale"},
                      "--e": {"key": "x.real", "not_here": "both"},
                      "--z": {"not_here": "gone"}}}
    assert fm.problems(flags, fmap, ours) == [
        "--z: a row for a flag slime's list does not hold",
        "--b: x.nothing is not a key of the schema (config/schema.py)",
        "--c: slime's default 'k1' differs from x.c='low_var_kl'; say why in why_default",
        "--d: the defaults agree; drop why_default",
        "--e: give exactly one of key and not_here",
        "--e: x.real is in the schema now; remove it from `pending`",
    ]
    fmap["flags"].pop("--a")
    assert fm.problems(flags, fmap, ours)[0] == "--a: no row in slime_flag_map.yaml (give its key, or not_here: why)"
