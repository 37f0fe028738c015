# ruff: noqa: E501 - programs are data
"""Problems judged by their own programs, for the judge's tests and benchmark: ``split`` (print
two positive integers that add up to n: many right answers) with a testlib checker and a
Kattis output validator, and ``guess`` (find a secret number in [1, n] asking ``? x``, answered
``<``, ``>`` or ``=``, then ``! x``) with interactors in C++ on testlib and in Python."""

from __future__ import annotations

from typing import Any

# split: "n" -> "a b" with a, b > 0 and a + b = n. The jury's answer is "1 n-1".
SPLIT_TESTS = [
    {"stdin": "5\n", "expected": "1 4\n"},
    {"stdin": "10\n", "expected": "1 9\n"},
    {"stdin": "2\n", "expected": "1 1\n"},
]
# A test whose answer is broken: the checker's own failure (FAIL), the problem's fault.
SPLIT_BROKEN = [{"stdin": "5\n", "expected": "oops\n"}]

SPLIT_CHECKER = r"""#include "testlib.h"
int main(int argc, char* argv[]) {
    registerTestlibCmd(argc, argv);
    long long n = inf.readLong();
    long long ja = ans.readLong(), jb = ans.readLong();  // the jury's: FAIL when unreadable
    if (ja + jb != n) quitf(_fail, "the jury's answer %lld %lld is wrong", ja, jb);
    long long a = ouf.readLong(), b = ouf.readLong();  // PE when not numbers
    if (a <= 0 || b <= 0) quitf(_wa, "%lld and %lld are not both positive", a, b);
    if (a + b == n) quitf(_ok, "%lld = %lld + %lld", n, a, b);
    if (a + b == n + 1 || a + b == n - 1) quitp(0.5, "%lld + %lld is off by one", a, b);
    quitf(_wa, "%lld + %lld != %lld", a, b, n);
}
"""

SPLIT_VALIDATOR = """import sys
n = int(open(sys.argv[1]).read())
feedback = sys.argv[3]
def say(code, message):
    open(feedback + "/judgemessage.txt", "w").write(message)
    sys.exit(code)
try:
    a, b = map(int, sys.stdin.read().split())
except ValueError:
    say(43, "not two integers")
if a > 0 and b > 0 and a + b == n:
    if a == b:
        open(feedback + "/score.txt", "w").write("0.25")
    say(42, f"{n} = {a} + {b}")
say(43, f"{a} + {b} != {n}")
"""

SPLIT = {
    "first": "n = int(input())\nprint(1, n - 1)\n",
    "last": "n = int(input())\nprint(n - 1, 1)\n",
    "half": "n = int(input())\nprint(n // 2, n - n // 2)\n",
    "wrong": "n = int(input())\nprint(n, n)\n",
    "words": "print('one and the rest')\n",
    "off-by-one": "n = int(input())\nprint(1, n)\n",
}

# guess: the input is "n secret"; at most 30 queries.
GUESS_TESTS = [{"stdin": "20 7\n"}, {"stdin": "20 20\n"}, {"stdin": "1000 1\n"}]

GUESS_INTERACTOR = r"""#include "testlib.h"
#include <iostream>
int main(int argc, char* argv[]) {
    registerInteraction(argc, argv);
    int n = inf.readInt(), secret = inf.readInt();
    std::cout << n << std::endl;
    int queries = 0;
    while (true) {
        std::string op = ouf.readToken();
        int x = ouf.readInt();
        if (op == "!") {
            if (x != secret) quitf(_wa, "guessed %d, the number was %d", x, secret);
            tout << queries << std::endl;
            quitf(_ok, "guessed %d in %d queries", secret, queries);
        }
        if (op != "?") quitf(_pe, "expected ? or !, got %s", op.c_str());
        if (++queries > 30) quitf(_wa, "over 30 queries");
        std::cout << (secret < x ? "<" : secret > x ? ">" : "=") << std::endl;
    }
}
"""

# The same interactor in Python, for either protocol (PROTOCOL is substituted).
_GUESS_PY = """import sys
KATTIS = PROTOCOL == "kattis"
n, secret = map(int, open(sys.argv[1]).read().split())
def say(code, message):
    if KATTIS:
        open(sys.argv[3] + "/judgemessage.txt", "w").write(message)
        sys.exit({0: 42, 1: 43, 2: 43}[code])
    sys.stderr.write(message + "\\n")
    sys.exit(code)
print(n, flush=True)
queries = 0
while True:
    line = sys.stdin.readline()
    if not line:
        say(2, "unexpected end of file")
    parts = line.split()
    if len(parts) != 2 or parts[0] not in ("?", "!") or not parts[1].lstrip("-").isdigit():
        say(2, f"expected ? x or ! x, got {line!r}")
    x = int(parts[1])
    if parts[0] == "!":
        if x != secret:
            say(1, f"guessed {x}, the number was {secret}")
        if not KATTIS:
            with open(sys.argv[2], "w") as report:
                report.write(f"{queries}\\n")
        say(0, f"guessed {secret} in {queries} queries")
    queries += 1
    if queries > 30:
        say(1, "over 30 queries")
    try:
        print("<" if secret < x else ">" if secret > x else "=", flush=True)
    except BrokenPipeError:
        say(1, "the submission stopped reading")
"""
GUESS_PY_TESTLIB = _GUESS_PY.replace("PROTOCOL", '"testlib"')
GUESS_PY_KATTIS = _GUESS_PY.replace("PROTOCOL", '"kattis"')

# After a testlib interactor, a checker reads its report (the number of queries): full points
# for at most 10, half for more.
QUERIES_CHECKER = """import sys
queries = int(open(sys.argv[2]).read())
if queries <= 10:
    sys.stderr.write(f"ok {queries} queries\\n")
    sys.exit(0)
sys.stderr.write(f"points 0.5 {queries} queries is too many\\n")
sys.exit(7)
"""

_SEARCH = """import sys
n = int(input())
lo, hi = 1, n
while True:
    mid = (lo + hi) // 2
    print("?", mid, flush=True)
    said = input().strip()
    if said == "=":
        print("!", mid, flush=True)
        break
    if said == "<":
        hi = mid - 1
    else:
        lo = mid + 1
"""

# The attack: reads the interactor's input (its fd of the test's input) to learn the secret,
# writes into its memory, kills it; then answers what it learnt (0 if nothing). It also says
# which fds it has (the runner's must not have leaked to it).
_ATTACK = """import os, signal, sys
me, found, tried = os.getpid(), None, set()
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != me]:
    for fd in range(0, 8):
        try:
            words = open(f"/proc/{pid}/fd/{fd}").read().split()
            tried.add(("fd", 0))
            if len(words) == 2:
                found = int(words[1])
        except (OSError, ValueError) as exc:
            tried.add(("fd", getattr(exc, "errno", -1)))
    for what, act in (("mem", lambda: open(f"/proc/{pid}/mem", "wb")), ("environ", lambda: open(f"/proc/{pid}/environ").read()), ("kill", lambda: os.kill(int(pid), signal.SIGKILL)), ("stop", lambda: os.kill(int(pid), signal.SIGSTOP))):
        try:
            act()
            tried.add((what, 0))
        except OSError as exc:
            tried.add((what, exc.errno))
sys.stderr.write(repr(sorted(tried)) + "\\n")
sys.stderr.write(repr(sorted(int(fd) for fd in os.listdir("/proc/self/fd"))) + "\\n")
n = int(input())
print("!", found or 0, flush=True)
"""

GUESS = {
    "search": _SEARCH,
    "linear": "import sys\nn = int(input())\nfor x in range(1, n + 1):\n    print('?', x, flush=True)\n    if input().strip() == '=':\n        print('!', x, flush=True)\n        break\n",
    "wrong": "n = int(input())\nprint('!', 3 if n != 3 else 4, flush=True)\n",
    "idle": "n = int(input())\ninput()  # waits for a word the interactor never says\n",
    "close": "import os, time\nn = int(input())\nos.close(1)\ntime.sleep(30)\n",
    # C stdio: a pipe's stdout is flushed when full or at exit (a Python submission is
    # unbuffered here: the judge image sets PYTHONUNBUFFERED)
    "no-flush": '#include <cstdio>\nint main(){int n;scanf("%d",&n);printf("? %d\\n",n/2);char s[8];scanf("%7s",s);}\n',
    "attack": _ATTACK,
}
GUESS_CPP = r"""#include <iostream>
#include <string>
int main() {
    int n; std::cin >> n;
    int lo = 1, hi = n;
    while (true) {
        int mid = (lo + hi) / 2;
        std::cout << "? " << mid << std::endl;
        std::string said; std::cin >> said;
        if (said == "=") { std::cout << "! " << mid << std::endl; return 0; }
        if (said == "<") hi = mid - 1; else lo = mid + 1;
    }
}
"""
# Signals the runner (its parent) from its first instant on, then plays right (AC, three
# tests: three starts): the runner's real uid must never be the submission's while it starts
# (as a posix_spawn's would be; then the runner dies in some starts and the item is retried)
GUESS["kill-runner"] = GUESS_CPP.replace(
    "int main() {",
    "#include <csignal>\n#include <unistd.h>\nint main() {\n"
    "    for (int i = 0; i < 100000; i++) kill(getppid(), SIGKILL);\n    kill(-1, SIGKILL);",
)


LANGUAGE = {"no-flush": "cpp17", "kill-runner": "cpp17"}  # the others are Python


def program(language: str, source: str, protocol: str = "testlib") -> dict[str, Any]:
    return {"language": language, "source": source, "protocol": protocol}
