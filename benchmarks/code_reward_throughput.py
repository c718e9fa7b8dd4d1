"""Code-reward throughput: samples scored per second by ``hybridflow.rewards.code.compute_score``.

    python benchmarks/code_reward_throughput.py [--samples 24] [--repeats 3]

Two workloads, each a mix of right and wrong programs (the reward of each is checked, so a
faster but wrong harness does not pass as faster):

- ``asserts``: MBPP/HumanEval-style rows, five ``assert`` entries per sample (plain calls,
  a comprehension, ``math.isclose``, ``Counter``), all in one sandbox per sample;
- ``stdio``: judge-style rows, three stdin/stdout cases per sample (one sandbox per case).

Samples are scored one after another in this process (a reward worker scores its share of a
batch the same way); the best of ``--repeats`` runs is printed, as samples per second.
"""

from __future__ import annotations

import argparse
import json
import time

from hybridflow.rewards.code import compute_score

ASSERTS = json.dumps({"asserts": [
    "assert add(2, 3) == 5",
    "assert add(-4, 10) == 6",
    "assert all(add(a, b) == a + b for a, b in [(1, 2), (3, 4), (5, 6)])",
    "import math\nassert math.isclose(area(2.0), 12.566, rel_tol=1e-3)",
    "from collections import Counter\nassert Counter(letters('abca')) == Counter({'a': 2, 'b': 1, 'c': 1})",
]})  # fmt: skip
RIGHT = (
    "import math\ndef add(a, b):\n    return a + b\n"
    "def area(r):\n    return math.pi * r * r\ndef letters(s):\n    return list(s)\n"
)
WRONG = RIGHT.replace("a + b", "a - b")  # passes the area and letters tests only: 2 of 5
STDIO = json.dumps({"inputs": ["2 3\n", "10 -4\n", "0 0\n"], "outputs": ["5\n", "6\n", "0\n"]})
STDIO_RIGHT = "a, b = map(int, input().split())\nprint(a + b)\n"
STDIO_WRONG = "a, b = map(int, input().split())\nprint(a - b)\n"  # right on "0 0" only: 1 of 3
WORKLOADS = {
    "asserts": (ASSERTS, [(RIGHT, 1.0), (WRONG, 0.4)]),
    "stdio": (STDIO, [(STDIO_RIGHT, 1.0), (STDIO_WRONG, 1 / 3)]),
}


def samples_per_second(truth: str, programs: list[tuple[str, float]], samples: int) -> float:
    start = time.perf_counter()
    for index in range(samples):
        program, expected = programs[index % len(programs)]
        score = compute_score(f"```python\n{program}```", truth, time_limit_s=5.0)["score"]
        if abs(score - expected) > 1e-9:
            raise SystemExit(f"wrong reward {score} (expected {expected}) for:\n{program}")
    return samples / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name, (truth, programs) in WORKLOADS.items():
        best = max(samples_per_second(truth, programs, args.samples) for _ in range(args.repeats))
        print(f"{name}: {best:.2f} samples/s (best of {args.repeats} x {args.samples} samples)")


if __name__ == "__main__":
    main()
