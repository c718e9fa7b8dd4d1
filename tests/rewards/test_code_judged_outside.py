"""Hostile programs against the code reward (issue 50): the judgement runs outside the program.

Each attack is a *wrong* (or too slow) program that scored against the harness of issue 38, where
parts of a test were evaluated inside the program's process. Now the program's process only calls
the program's own functions on inputs the harness sends and answers plain data; every other part
of a test runs in the trusted harness, by its own clock. The attacks only touch the sandbox's own
files and processes.
"""

import json

import pytest

from hybridflow.rewards import code_sandbox, sandbox_limits
from hybridflow.rewards.code import compute_score
from hybridflow.rewards.code_sandbox import run_asserts, run_python

needs_bwrap = pytest.mark.skipif(
    not code_sandbox.sandbox_available(),
    reason=f"no working sandbox here ({code_sandbox.bwrap_problem()}); `make venv` installs bubblewrap",
)
pytestmark = needs_bwrap


def score(program: str, asserts: list[str], time_limit_s: float = 5.0) -> float:
    truth = json.dumps({"asserts": asserts})
    return compute_score(f"```python\n{program}```", truth, time_limit_s=time_limit_s)["score"]


# ----------------------------------------------------------------- objects that say "equal" to anything
ALWAYS_EQUAL = r"""
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __bool__(self):
        return True
    def __hash__(self):
        return 0
def add(a, b):
    return Anything()
"""
EQUAL_SUBCLASSES = r"""
class Int(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
class Items(list):
    def __eq__(self, other):
        return True
class Text(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
def add(a, b):
    return Int(a - b)
def pair(a, b):
    return Items([b])
def name(a):
    return Text('wrong')
"""
# every shape of test the old harness sent whole into the program's process
TEST_SHAPES = [
    "assert all(add(a, b) == c for a, b, c in [(2, 3, 5), (10, -4, 6)])",
    "assert [add(a, b) for a, b in [(2, 3)]] == [5]",
    "assert (lambda: add(2, 3))() == 5",
    "assert (add(2, 3) if True else 0) == 5",
    "assert {k: add(k, 1) for k in [1]} == {1: 2}",
    "assert any([add(2, 3) == 5])",
    "assert add(2, 3) == 5",
    "assert 5 == add(2, 3)",
    # the comparison itself inside a comprehension, a lambda, a conditional expression
    "assert [add(a, b) == c for a, b, c in [(2, 3, 5)]] == [True]",
    "assert [x == 5 for x in [add(2, 3)]][0]",
    "assert (lambda: add(2, 3) == 5)()",
    "assert (add(2, 3) == 5 if True else False)",
    "assert {k: add(k, 1) == 2 for k in [1]} == {1: True}",
    "assert next(iter([add(2, 3) == 5]))",
]


@pytest.mark.parametrize("test", TEST_SHAPES)
def test_an_object_equal_to_anything_fails_every_test_shape(test):
    assert score("def add(a, b):\n    return a + b\n", [test]) == 1.0  # the right program passes it
    assert score(ALWAYS_EQUAL, [test]) == 0.0


def test_subclasses_of_plain_types_that_override_eq_fail():
    tests = ["assert add(2, 3) == 5", "assert pair(1, 2) == [2, 1]", "assert name('x') == 'x!'",
             "assert [add(a, b) for a, b in [(2, 3)]] == [5]"]  # fmt: skip
    assert score(EQUAL_SUBCLASSES, tests) == 0.0


# ----------------------------------------------------------------- the program replaces what the test uses
REPLACE_MATH = r"""
import math, builtins
math.isclose = lambda *args, **kwargs: True
math.fabs = lambda x: 0.0
builtins.abs = lambda x: 0.0
builtins.all = builtins.any = lambda items: True
builtins.sorted = lambda items, **kwargs: [1, 2, 3]
def area(r):
    return 1.0
def primes(n):
    return [4]
"""
REPLACED_NAME_TESTS = [
    "import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)",
    "import math\nassert math.fabs(area(2) - 12.566) < 1e-3",
    "assert math.fabs(area(2) - 12.566) < 1e-3",  # HumanEval style: `math` comes from the program's import
    "assert abs(area(2) - 12.566) < 1e-3",
    "assert all(x > 10 for x in [area(2)])",
    "assert sorted(primes(5)) == [1, 2, 3]",
]


@pytest.mark.parametrize("test", REPLACED_NAME_TESTS)
def test_replacing_math_or_builtins_in_the_program_does_not_reach_the_test(test):
    right = "import math\ndef area(r):\n    return math.pi * r * r\ndef primes(n):\n    return [3, 2, 1]\n"
    assert score(right, [test]) == 1.0
    assert score(REPLACE_MATH, [test]) == 0.0


# ----------------------------------------------------------------- expected values never reach the program
READ_EXPECTED = r"""
import builtins, collections, gc, re, sys
from collections import Counter
SEEN = []
_eval, _init = builtins.eval, collections.Counter.__init__
def _spy(source, *args, **kwargs):
    SEEN.append(source if isinstance(source, str) else repr(source))
    return _eval(source, *args, **kwargs)
def _spy_init(self, *args, **kwargs):
    SEEN.append(repr(args) + repr(kwargs))
    _init(self, *args, **kwargs)
builtins.eval = _spy
collections.Counter.__init__ = _spy_init
def _texts():
    yield from SEEN
    frame = sys._getframe(1)
    while frame is not None:
        yield repr(frame.f_locals)
        frame = frame.f_back
    for thing in gc.get_objects():
        if type(thing) in (str, dict):
            yield repr(thing)[:2000]
def letters(s):
    for text in _texts():
        found = re.search(r"(\{'[^{}]*\})", text)
        if found and 'letters' not in text and 'abc' not in text:
            return dict(_eval(found.group(1)))
    return {}
def add(a, b):
    for text in [*SEEN[::-1], *_texts()]:
        numbers = [int(n) for n in re.findall(r"-?\d+", text) if int(n) not in (a, b)]
        if numbers and 'add' not in text:
            return numbers[0]
    return a - b
"""


@pytest.mark.parametrize("test", [
    "from collections import Counter\nassert Counter({'x': 3}) == Counter(letters('abc'))",
    "from collections import Counter\nassert Counter(letters('abc')) == Counter({'x': 3})",
    "assert Counter({'x': 3}) == Counter(letters('abc'))",  # Counter: the program's own import
    "assert add(2, 3) == 5",
    "assert [5][0] == add(2, 3)",
    "assert (5, 'x')[0] == add(2, 3)",
    "assert sorted([add(2, 3)], key=lambda v: -v) == [5]",
])  # fmt: skip
def test_the_expected_values_never_enter_the_program(test):
    assert score(READ_EXPECTED, [test]) == 0.0


# ----------------------------------------------------------------- what crosses: plain data only
COUNTER = "from collections import Counter\ndef letters(s):\n    return Counter(s)\n"
RIGHT_PROGRAMS = [
    ("def add(a, b):\n    return a + b\n", "assert add(a=2, b=3) == 5 and add(2, b=3) == 5"),
    ("import math\ndef fact(n):\n    return math.prod(range(1, n + 1))\n",
     "assert fact(2000) % 10**10 == 0 and len(str(fact(30))) == 33"),  # 5736 digits: past repr's int limit
    (COUNTER, "assert letters('aab') == {'a': 2, 'b': 1}"),
    (COUNTER, "assert letters('aab') == Counter({'a': 2, 'b': 1})"),  # Counter: the program's import, made here
    ("import math\ndef nan():\n    return float('nan')\n", "assert math.isnan(nan())"),
    ("def pack(a):\n    return (a, [a], {a: {a}}, frozenset([a]), b'x', None, True, 1.5, 2j)\n",
     "assert pack(1) == (1, [1], {1: {1}}, frozenset([1]), b'x', None, True, 1.5, 2j)"),
    ("LIMIT = 7\ndef add(a, b):\n    return a + b\n", "assert add(LIMIT, 1) == 8"),
    # HumanEval style: the test uses math unimported, the program imports it only where it needs it
    ("def area(r):\n    import math\n    return math.pi * r * r\n", "assert math.fabs(area(2) - 12.566) < 1e-3"),
    ("def grow(xs):\n    xs.append(1)\n    return xs\n", "assert grow([0]) == [0, 1]"),
    ("import sys\ndef add(a, b):\n    return a + b\nsys.exit(0)\n", "assert add(1, 1) == 2"),
    ("def add(a, b):\n    return a + b\n", "assert all(add(string, 1) == string + 1 for string in [1, 2])"),
]  # fmt: skip


@pytest.mark.parametrize("program, test", RIGHT_PROGRAMS)
def test_a_right_program_keeps_its_reward(program, test):
    assert score(program, [test]) == 1.0


@pytest.mark.parametrize("program, test", [
    ("def gen(n):\n    yield from range(n)\n", "assert list(gen(3)) == [0, 1, 2]"),
    ("def make():\n    return lambda x: x\n", "assert make()(3) == 3"),
    ("class P:\n    pass\ndef make():\n    return P()\n", "assert make() is not None"),
    ("def span(n):\n    return range(n)\n", "assert list(span(3)) == [0, 1, 2]"),
    ("def deep(n):\n    x = []\n    for _ in range(n):\n        x = [x]\n    return x\n", "assert deep(100) != 0"),
    ("def f(a):\n    return a\n", "assert f(lambda: 1) is not None"),  # an argument that is not data
], ids=["generator", "function", "object", "range", "too-deep", "lambda-argument"])  # fmt: skip
def test_what_is_not_plain_data_fails_the_test(program, test):
    assert score(program, [test]) == 0.0


FORGED_REPLIES = r"""
import os
def add(a, b):
    return a - b
for fd in range(3, 64):
    try:
        os.write(fd, b'{"ready": 1}\n{"v": 5}\n{"v": 6}\n{"names": {"add": {"v": 5}}}\n{"v": 7}\n' * 4)
    except OSError:
        pass
"""


def test_replies_written_ahead_by_the_program_are_only_its_answers():
    assert score(FORGED_REPLIES, ["assert add(2, 3) == 5", "assert add(10, -4) == 6", "assert add(0, 7) == 7"]) == 0.0


# ----------------------------------------------------------------- time by the harness's own clock
STOP_THE_JUDGE = r"""
import os, signal, time
LIMIT = 1.0
def add(a, b):
    targets = [pid for pid in range(1, 64) if pid != os.getpid()]
    for pid in targets:
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            pass
    if os.fork() == 0:
        time.sleep(1.7 * LIMIT)  # once the late answer is written
        for pid in targets:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        os._exit(0)
    time.sleep(1.5 * LIMIT)  # too slow
    return a + b
"""


def test_a_late_answer_is_a_time_out_even_if_the_program_stops_the_judge():
    assert score(STOP_THE_JUDGE.replace("time.sleep(1.5 * LIMIT)", "pass"), ["assert add(2, 3) == 5"]) == 1.0
    assert score(STOP_THE_JUDGE, ["assert add(2, 3) == 5"], time_limit_s=1.0) == 0.0


def test_a_slow_answer_is_a_time_out():
    slow = "import time\ndef add(a, b):\n    time.sleep(2.0)\n    return a + b\n"
    assert score(slow, ["assert add(2, 3) == 5"], time_limit_s=1.0) == 0.0


# ----------------------------------------------------------------- the whole output is judged
@pytest.mark.parametrize("padding", ["' ' * (2 << 20)", "'\\n' * (2 << 20)", "'\\t \\n' * (1 << 20)"])
def test_a_wrong_answer_after_megabytes_of_whitespace_fails(padding):
    truth = json.dumps({"inputs": [""], "outputs": ["ok\n"]})
    program = f"import sys\nsys.stdout.write('ok\\n' + {padding} + '\\nwrong\\n')\n"
    assert compute_score(f"```python\n{program}```", truth, time_limit_s=10.0)["score"] == 0.0


def test_a_right_answer_longer_than_a_mebibyte_passes():
    line = "x" * (3 << 19)  # 1.5 MiB
    truth = json.dumps({"inputs": [""], "outputs": [line + "\n"]})
    program = f"print('x' * {len(line)})\n"
    assert compute_score(f"```python\n{program}```", truth, time_limit_s=10.0)["score"] == 1.0


def test_a_right_answer_with_megabytes_on_stderr_still_passes():
    truth = json.dumps({"inputs": [""], "outputs": ["ok\n"]})
    program = "import sys\nsys.stderr.write('debug\\n' * (1 << 19))\nprint('ok')\n"
    assert compute_score(f"```python\n{program}```", truth, time_limit_s=10.0)["score"] == 1.0


# ----------------------------------------------------------------- kernel memory of the writable folders
MAKE_FILES = r"""
import os
made = 0
try:
    for k in range(60000):
        MAKE
        made += 1
except OSError:
    pass
print(made)
"""


@pytest.mark.parametrize("folder", ["/tmp", "/sandbox", "/dev/shm"])
@pytest.mark.parametrize("make", [
    "open(f'{FOLDER}/f{k}', 'w').close()",
    "os.mkdir(f'{FOLDER}/d{k}')",
    "os.symlink('x', f'{FOLDER}/s{k}')",
    "k or open(f'{FOLDER}/target', 'w').close(); os.link(f'{FOLDER}/target', f'{FOLDER}/h{k}')",
], ids=["files", "dirs", "symlinks", "hard-links"])  # fmt: skip
def test_empty_files_cannot_hold_unbounded_kernel_memory(folder, make):
    program = MAKE_FILES.replace("MAKE", make.replace("{FOLDER}", folder))
    run = run_python(program, timeout_s=30.0)
    assert run.ok, run.stderr
    assert int(run.stdout) <= sandbox_limits.TMPFS_INODES


def test_without_the_inode_caps_the_sandbox_still_runs_on_bwraps_own_tmpfs(monkeypatch):
    monkeypatch.setattr(code_sandbox, "inode_caps_work", lambda: False)  # as where unshare is refused
    run = run_python(MAKE_FILES.replace("MAKE", "open(f'/tmp/f{k}', 'w').close()").replace("60000", "5000"))
    assert run.ok and int(run.stdout) == 5000  # uncapped: what the warning of bwrap_problem says


# ----------------------------------------------------------------- a null time limit
def test_a_null_time_limit_gets_the_documented_default(monkeypatch):
    for name in (code_sandbox.ALLOW_UNSANDBOXED_ENV, code_sandbox.TIMEOUT_ENV, code_sandbox.MEMORY_ENV):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    from hybridflow.config.loader import load_config
    from hybridflow.config.ppo import PPOConfig

    cfg = load_config(PPOConfig, ["actor_rollout_ref.model.path=/m", "reward_model.sandbox_fusion.timeout_s=null"])
    timeout_s = cfg.reward_model.sandbox_fusion.timeout_s
    code_sandbox.apply_sandbox_settings(allow_unsandboxed=False, timeout_s=timeout_s, memory_mb=1024)
    assert code_sandbox.default_limits()[0] == code_sandbox.DEFAULT_TIMEOUT_S == 10.0
    monkeypatch.setattr(code_sandbox, "DEFAULT_TIMEOUT_S", 1.0)  # the same path, a shorter wait
    run = run_python("import time\ntime.sleep(10**6)\n", timeout_s=None)
    assert run.timed_out
    assert run_asserts("import time\ntime.sleep(10**6)\n", ["assert True"], timeout_s=None) == [False]


# ------------------------------------------------- the program's standard imports that would run in the judge
# A name the program imports from a pure standard module is imported in the judge too (so a test may use the
# program's ``Counter``). Bound under another name (``as``) or to a module with effects on the process, that rule
# would hand the judge a function the program chose: ``from sys import exit as add`` raised SystemExit in the
# reward process, ``from os import _exit as add`` would end it, ``from time import sleep as add`` stall it.
STDLIB_UNDER_THE_TESTED_NAME = [
    "from sys import exit as add\n",
    "import sys\nadd = sys.exit\n",
    "from os import _exit as add\n",
    "from time import sleep as add\n",
    "from math import hypot as add\n",  # harmless, but still the program's own name: asked from the program
]


@pytest.mark.parametrize("program", STDLIB_UNDER_THE_TESTED_NAME)
def test_a_standard_function_bound_to_the_tested_name_is_called_in_the_sandbox(program):
    from hybridflow.rewards.sandbox_judge import stdlib_imports

    assert "add" not in stdlib_imports(program)


def test_an_aliased_exit_ends_only_the_program_and_scores_zero():
    assert score("from sys import exit as add\n", ["assert add(1, 2) == 3"]) == 0.0


def test_a_right_program_that_aliases_a_standard_function_keeps_its_reward():
    assert score("from math import gcd as common\n", ["assert common(12, 18) == 6"]) == 1.0


def test_the_judge_trusts_only_unaliased_imports_of_effect_free_modules():
    from hybridflow.rewards.sandbox_judge import stdlib_imports

    trusted = stdlib_imports("from collections import Counter\nimport math\nfrom os import getcwd\nimport time\n"
                             "from itertools import _private\n")
    assert trusted == {"Counter": ("collections", "Counter"), "math": ("math", None)}
