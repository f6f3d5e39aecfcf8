"""The CPU agent example: three-digit multiplication with a calculator tool.

A ~1M-parameter model cannot multiply 347*829 in its head, but it can learn to write
`<tool_call>347*829</tool_call>`, read `<tool_response>287663</tool_response>` and copy the result.
The reward scores only the final model turn against the label, so a trajectory is right only if the
model called the tool with the right operands and copied the answer.

`python -m slime_hydra.agent.calculator` regenerates slime_hydra/assets/multiplication/.
"""

from __future__ import annotations

import argparse
import ast
import operator
import random
from pathlib import Path
from typing import Optional

from slime_hydra.agent.env import StepResult, ToolError
from slime_hydra.data.arithmetic import write_jsonl
from slime_hydra.types import Sample

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_DIGITS = 12  # a result longer than this is refused (the model's context is small)


def evaluate(expr: str) -> int:
    """Integer + - * expressions only; anything else is a ToolError (a malformed call)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an expression: {expr!r}") from None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ToolError(f"unsupported: {ast.dump(node)}")

    value = ev(tree.body)
    if len(str(abs(value))) > MAX_DIGITS:
        raise ToolError("result too long")
    return value


class CalculatorEnv:
    """A stateless calculator: step("347*829") -> "287663". Never done: the model decides when to answer."""

    def reset(self, sample: Sample) -> None:
        pass

    def step(self, call: str) -> StepResult:
        return StepResult(str(evaluate(call)))


def final_answer_reward(sample: Sample) -> float:
    """1 when the last model turn (markers stripped) is exactly the label, else 0. Sees the whole trajectory:
    a trajectory whose last turn is a tool call, or that stopped after an observation, scores 0."""
    turns = sample.metadata.get("model_turns") or [sample.response]
    return float(sample.label is not None and turns[-1].strip() == str(sample.label))


def demonstrations(prompts, tokenizer, call_start: str = "<tool_call>", call_end: str = "</tool_call>",
                   observation_template: str = "<tool_response>{observation}</tool_response>") -> list[Sample]:
    """SFT samples of the full tool trajectory (warmstart.custom_sft_samples): model tokens train, the
    observation is masked exactly as in RL."""
    out = []
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for p in prompts:
        expr = p.text.rstrip("=")
        call = enc(f"{call_start}{expr}{call_end}")
        obs = enc(observation_template.format(observation=str(evaluate(expr))))
        answer = enc(p.label) + [tokenizer.eos_token_id]
        response = call + obs + answer
        out.append(Sample(prompt=p.prompt, label=p.label, prompt_tokens=list(p.tokens), tokens=list(p.tokens) + response,
                          response_length=len(response), loss_mask=[1] * len(call) + [0] * len(obs) + [1] * len(answer)))
    return out


def make_rows(low: int, high: int, n: int, seed: int, tools: Optional[list] = None) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        row = {"prompt": f"{a}*{b}=", "label": str(a * b)}
        if tools is not None:
            row["tools"] = tools
        rows.append(row)
    return rows


def generate_files(out_dir: Path) -> None:
    rows = make_rows(100, 999, 4200, seed=0)
    write_jsonl(rows[200:], out_dir / "multiplication" / "train.jsonl")
    write_jsonl(rows[:200], out_dir / "multiplication" / "test.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "assets")
    generate_files(parser.parse_args().out)


if __name__ == "__main__":
    main()
