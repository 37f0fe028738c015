# ruff: noqa: E501 - submissions are data, one line each
"""A small problem set for the judge's tests and benchmark: problems with their tests, and for
every language of the judge image submissions meant to get each verdict on ``sum``."""

from __future__ import annotations

import random
from typing import Any

# sum: "a b" -> a + b. The WA submissions multiply: right on the first test only.
SUM_TESTS = [
    {"stdin": "2 2\n", "expected": "4\n"},
    {"stdin": "1 2\n", "expected": "3\n"},
    {"stdin": "5 7\n", "expected": "12\n"},
]

# The sum problem's submissions in Python, for CPython and PyPy alike.
PYTHON_SUM: dict[str, str] = {
    "AC": "a, b = map(int, input().split())\nprint(a + b)\n",
    "WA": "a, b = map(int, input().split())\nprint(a * b)\n",
    "TLE": "while True:\n    pass\n",
    "MLE": "x = b'x' * (512 << 20)\nprint(len(x))\n",
    "RE": "raise SystemExit(3)\n",
    "CE": "def f(:\n    pass\n",
    "OLE": "while True:\n    print('y' * 100)\n",
}

# Per language: the verdict -> source of a submission to the sum problem: AC, WA, TLE, RE and CE
# for every language, MLE and OLE where a submission gets them cheaply.
SUM: dict[str, dict[str, str]] = {
    "python3": PYTHON_SUM,
    "c": {
        "AC": '#include <stdio.h>\nint main(){long a,b;scanf("%ld %ld",&a,&b);printf("%ld\\n",a+b);}',
        "WA": '#include <stdio.h>\nint main(){long a,b;scanf("%ld %ld",&a,&b);printf("%ld\\n",a*b);}',
        "TLE": "int main(){volatile long x=0;for(;;)x++;}",
        "MLE": '#include <stdlib.h>\n#include <stdio.h>\nint main(){volatile char*p=malloc(512<<20);for(long i=0;i<(512<<20);i+=1024)p[i]=1;printf("%d\\n",p[99]);}',
        "RE": "int main(){return 3;}",
        "CE": "int main(){return x;}",
        "OLE": '#include <stdio.h>\nint main(){for(;;)puts("yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy");}',
    },
    "cpp17": {
        "AC": "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}",
        "WA": "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a*b<<'\\n';}",
        "TLE": "int main(){volatile long x=0;for(;;)x++;}",
        "MLE": '#include <vector>\n#include <cstdio>\nint main(){std::vector<char> v(512<<20,1);printf("%d\\n",v[99]);}',
        "RE": "#include <cstdlib>\nint main(){std::abort();}",
        "CE": "int main(){return x;}",
        "OLE": '#include <cstdio>\nint main(){for(;;)std::puts("yyyyyyyyyyyyyyyyyyyyyyyyyyyyy");}',
    },
    "cpp20": {
        "AC": "#include <iostream>\n#include <span>\nint main(){long v[2];std::cin>>v[0]>>v[1];std::span s(v);std::cout<<s[0]+s[1]<<'\\n';}",
        "WA": "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a*b<<'\\n';}",
        "TLE": "int main(){volatile long x=0;for(;;)x++;}",
        "MLE": '#include <vector>\n#include <cstdio>\nint main(){std::vector<char> v(512<<20,1);printf("%d\\n",v[99]);}',
        "RE": "int main(){volatile int*p=nullptr;*p=1;}",
        "CE": "int main(){return x;}",
        "OLE": '#include <cstdio>\nint main(){for(;;)std::puts("yyyyyyyyyyyyyyyyyyyyyyyyyyyyy");}',
    },
    "java17": {
        "AC": "import java.util.*;\npublic class Main{public static void main(String[] a){Scanner s=new Scanner(System.in);long x=s.nextLong(),y=s.nextLong();System.out.println(x+y);}}",
        "WA": "import java.util.*;\npublic class Main{public static void main(String[] a){Scanner s=new Scanner(System.in);long x=s.nextLong(),y=s.nextLong();System.out.println(x*y);}}",
        "TLE": "public class Main{public static void main(String[] a){long x=0;while(true){x++;}}}",
        "MLE": "public class Main{public static void main(String[] a){byte[][] b=new byte[64][];for(int i=0;i<64;i++){b[i]=new byte[8<<20];java.util.Arrays.fill(b[i],(byte)1);}System.out.println(b[3][5]);}}",
        "RE": "public class Main{public static void main(String[] a){System.exit(3);}}",
        "CE": "public class Main{public static void main(String[] a){return x;}}",
        "OLE": 'public class Main{public static void main(String[] a){while(true)System.out.println("yyyyyyyyyyyyyyyyyyyy");}}',
    },
    "go": {
        "AC": 'package main\nimport "fmt"\nfunc main(){var a,b int64;fmt.Scan(&a,&b);fmt.Println(a+b)}',
        "WA": 'package main\nimport "fmt"\nfunc main(){var a,b int64;fmt.Scan(&a,&b);fmt.Println(a*b)}',
        "TLE": "package main\nfunc main(){x:=0;for{x++}}",
        "MLE": 'package main\nimport "fmt"\nfunc main(){b:=make([]byte,512<<20);for i:=range b{b[i]=1};fmt.Println(b[99])}',
        "RE": 'package main\nimport "os"\nfunc main(){os.Exit(3)}',
        "CE": "package main\nfunc main(){return x}",
        "OLE": 'package main\nimport "fmt"\nfunc main(){for{fmt.Println("yyyyyyyyyyyyyyyyyyyy")}}',
    },
    "rust": {
        "AC": 'use std::io::*;\nfn main(){let mut s=String::new();stdin().read_to_string(&mut s).unwrap();let v:Vec<i64>=s.split_whitespace().map(|x|x.parse().unwrap()).collect();println!("{}",v[0]+v[1]);}',
        "WA": 'use std::io::*;\nfn main(){let mut s=String::new();stdin().read_to_string(&mut s).unwrap();let v:Vec<i64>=s.split_whitespace().map(|x|x.parse().unwrap()).collect();println!("{}",v[0]*v[1]);}',
        "TLE": 'fn main(){let mut x:u64=1;loop{x=x.wrapping_mul(6364136223846793005).wrapping_add(1);if x==42{println!("{}",x);}}}',
        "MLE": 'fn main(){let v=vec![1u8;512<<20];println!("{}",v[99]);}',
        "RE": "fn main(){std::process::exit(3);}",
        "CE": "fn main(){return x;}",
        "OLE": 'fn main(){loop{println!("yyyyyyyyyyyyyyyyyyyy");}}',
    },
    "pypy3": PYTHON_SUM,  # the same sources: PyPy runs Python 3
    "kotlin": {
        "AC": 'fun main(){val(a,b)=readLine()!!.trim().split(" ").map{it.toLong()};println(a+b)}',
        "WA": 'fun main(){val(a,b)=readLine()!!.trim().split(" ").map{it.toLong()};println(a*b)}',
        "TLE": "fun main(){var x=0L;while(true){x++}}",
        "MLE": "fun main(){val b=Array(64){ByteArray(8 shl 20)};for(a in b)a.fill(1);println(b[3][5])}",
        "RE": "fun main(){kotlin.system.exitProcess(3)}",
        "CE": "fun main(){return x}",
        "OLE": 'fun main(){while(true)println("yyyyyyyyyyyyyyyyyyyy")}',
    },
    "csharp": {
        "AC": "using System;class P{static void Main(){var t=Console.ReadLine().Split(' ');Console.WriteLine(long.Parse(t[0])+long.Parse(t[1]));}}",
        "WA": "using System;class P{static void Main(){var t=Console.ReadLine().Split(' ');Console.WriteLine(long.Parse(t[0])*long.Parse(t[1]));}}",
        "TLE": "class P{static long x;static void Main(){while(true){x++;}}}",
        "MLE": "class P{static void Main(){var b=new byte[512<<20];for(int i=0;i<b.Length;i+=1024)b[i]=1;System.Console.WriteLine(b[99]);}}",
        "RE": "class P{static int Main(){return 3;}}",
        "CE": "class P{static void Main(){return x;}}",
        "OLE": 'class P{static void Main(){while(true)System.Console.WriteLine("yyyyyyyyyyyyyyyyyyyy");}}',
    },
    "haskell": {
        "AC": "main :: IO ()\nmain = do\n  [a, b] <- map read . words <$> getLine :: IO [Integer]\n  print (a + b)\n",
        "WA": "main :: IO ()\nmain = do\n  [a, b] <- map read . words <$> getLine :: IO [Integer]\n  print (a * b)\n",
        "TLE": "main :: IO ()\nmain = print (length [1 :: Int ..])\n",
        "RE": "import System.Exit\nmain :: IO ()\nmain = exitWith (ExitFailure 3)\n",
        "CE": "main :: IO ()\nmain = print x\n",
        "OLE": "main :: IO ()\nmain = mapM_ putStrLn (repeat (replicate 100 'y'))\n",
    },
    "ocaml": {
        "AC": 'let () = Scanf.scanf " %d %d" (fun a b -> Printf.printf "%d\\n" (a + b))\n',
        "WA": 'let () = Scanf.scanf " %d %d" (fun a b -> Printf.printf "%d\\n" (a * b))\n',
        "TLE": "let rec loop x = loop (x + 1)\nlet () = loop 0\n",
        "RE": "let () = exit 3\n",
        "CE": "let () = print_int x\n",
        "OLE": 'let () = while true do print_endline "yyyyyyyyyyyyyyyyyyyy" done\n',
    },
    "pascal": {
        "AC": "var a,b:int64;begin readln(a,b);writeln(a+b);end.",
        "WA": "var a,b:int64;begin readln(a,b);writeln(a*b);end.",
        "TLE": "var x:int64;begin x:=0;while true do inc(x);end.",
        "MLE": "var p:pchar;i:longint;begin getmem(p,512 shl 20);i:=0;while i<(512 shl 20) do begin p[i]:='x';inc(i,1024);end;writeln(ord(p[99]));end.",
        "RE": "begin halt(3);end.",
        "CE": "begin x:=1;end.",
        "OLE": "begin while true do writeln('yyyyyyyyyyyyyyyyyyyy');end.",
    },
    "fortran": {
        "AC": "program s\ninteger(8)::a,b\nread(*,*)a,b\nprint '(I0)',a+b\nend program s\n",
        "WA": "program s\ninteger(8)::a,b\nread(*,*)a,b\nprint '(I0)',a*b\nend program s\n",
        "TLE": "program t\ninteger(8)::x\nx=0\ndo\nx=x+1\nif(x==-1)print *,x\nend do\nend program t\n",
        "RE": "program r\nstop 3\nend program r\n",
        "CE": "program c\nx = \nend program c\n",
        "OLE": "program o\ndo\nprint '(A)','yyyyyyyyyyyyyyyyyyyy'\nend do\nend program o\n",
    },
    "d": {
        "AC": 'import std.stdio;void main(){long a,b;readf(" %d %d",&a,&b);writeln(a+b);}',
        "WA": 'import std.stdio;void main(){long a,b;readf(" %d %d",&a,&b);writeln(a*b);}',
        "TLE": "import std.stdio;void main(){long x=0;while(true){x++;if(x==-1)writeln(x);}}",
        "RE": "int main(){return 3;}",
        "CE": "void main(){return x;}",
        "OLE": 'import std.stdio;void main(){while(true)writeln("yyyyyyyyyyyyyyyyyyyy");}',
    },
    "commonlisp": {
        "AC": '(let ((a (read)) (b (read))) (format t "~d~%" (+ a b)))\n',
        "WA": '(let ((a (read)) (b (read))) (format t "~d~%" (* a b)))\n',
        "TLE": "(loop)\n",
        "RE": "(sb-ext:exit :code 3)\n",
        "CE": "(defun f (\n",
        "OLE": '(loop (write-line "yyyyyyyyyyyyyyyyyyyy"))\n',
    },
    "prolog": {
        "AC": ":- initialization(main).\nmain :- read_integer(A), read_integer(B), C is A + B, write(C), nl.\n",
        "WA": ":- initialization(main).\nmain :- read_integer(A), read_integer(B), C is A * B, write(C), nl.\n",
        "TLE": ":- initialization(main).\nloop(X) :- Y is X + 1, loop(Y).\nmain :- loop(0).\n",
        "RE": ":- initialization(main).\nmain :- halt(3).\n",
        "CE": ":- initialization(main).\nmain :- write(.\n",
        "OLE": ":- initialization(main).\nmain :- repeat, write(yyyyyyyyyyyyyyyyyyyy), nl, fail.\n",
    },
    "ruby": {
        "AC": "a, b = gets.split.map(&:to_i)\nputs a + b\n",
        "WA": "a, b = gets.split.map(&:to_i)\nputs a * b\n",
        "TLE": "loop {}\n",
        "MLE": "x = 'x' * (512 << 20)\nputs x.size\n",
        "RE": "exit 3\n",
        "CE": "def f(\n",
        "OLE": "loop { puts 'y' * 100 }\n",
    },
    "php": {
        "AC": "<?php\n[$a, $b] = array_map('intval', explode(' ', trim(fgets(STDIN))));\necho $a + $b, \"\\n\";\n",
        "WA": "<?php\n[$a, $b] = array_map('intval', explode(' ', trim(fgets(STDIN))));\necho $a * $b, \"\\n\";\n",
        "TLE": "<?php\nwhile (true) {}\n",
        "MLE": "<?php\n$x = str_repeat('x', 512 << 20);\necho strlen($x), \"\\n\";\n",
        "RE": "<?php\nexit(3);\n",
        "CE": "<?php\nfunction (\n",
        "OLE": "<?php\nwhile (true) echo str_repeat('y', 100), \"\\n\";\n",
    },
    "perl": {
        "AC": "my ($a, $b) = split ' ', <STDIN>;\nprint $a + $b, \"\\n\";\n",
        "WA": "my ($a, $b) = split ' ', <STDIN>;\nprint $a * $b, \"\\n\";\n",
        "TLE": "1 while 1;\n",
        "MLE": "my $x = 'x' x (512 << 20);\nprint length($x), \"\\n\";\n",
        "RE": "exit 3;\n",
        "CE": "sub f {\n",
        "OLE": "print 'y' x 100, \"\\n\" while 1;\n",
    },
    "lua": {
        "AC": 'local a, b = io.read("n", "n")\nprint(a + b)\n',
        "WA": 'local a, b = io.read("n", "n")\nprint(a * b)\n',
        "TLE": "while true do end\n",
        "MLE": 'local x = string.rep("x", 512 << 20)\nprint(#x)\n',
        "RE": "os.exit(3)\n",
        "CE": "function (\n",
        "OLE": 'while true do print(string.rep("y", 100)) end\n',
    },
    "javascript": {
        "AC": "const [a,b]=require('fs').readFileSync(0,'utf8').trim().split(/\\s+/).map(Number);console.log(a+b);",
        "WA": "const [a,b]=require('fs').readFileSync(0,'utf8').trim().split(/\\s+/).map(Number);console.log(a*b);",
        "TLE": "for(;;){}",
        "MLE": "const b=Buffer.alloc(512<<20,1);console.log(b[99]);",
        "RE": "process.exit(3);",
        "CE": "function (",
        "OLE": "const s='y'.repeat(100)+'\\n';for(;;)process.stdout.write(s);",
    },
    "bash": {
        "AC": "read a b\necho $((a + b))\n",
        "WA": "read a b\necho $((a * b))\n",
        "TLE": "while :; do :; done\n",
        "MLE": "printf -v x '%*s' 400000000 ''\necho ${#x}\n",
        "RE": "exit 3\n",
        "CE": "if then fi\n",
        "OLE": "while :; do echo yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy; done\n",
    },
}
LANGUAGES = sorted(SUM)
# The verdicts of each test a submission gets on SUM_TESTS (stopping at the first failure).
SUM_VERDICTS = {
    "AC": ["AC", "AC", "AC"],
    "WA": ["AC", "WA"],
    "TLE": ["TLE"],
    "MLE": ["MLE"],
    "RE": ["RE"],
    "CE": [],
    "OLE": ["OLE"],
}
SUM_LIMITS = {"time_s": 1.0, "memory_mb": 128, "output_mb": 1}
SLOW_START = {"java17": 3.0, "kotlin": 3.0, "bash": 3.0}  # a JVM's start is counted; bash is slow
# The sum submissions' wall limit: their verdicts are not about it, and a test worker shares
# its cores (bash's 400 MB string took 9 s of wall for 1.3 s of CPU at a load of 18 on 2).
SUM_WALL_S = 30.0


def sum_items() -> list[dict[str, Any]]:
    """Every language's submission for every verdict, as judge items (ids LANG/VERDICT)."""
    items = []
    for language in LANGUAGES:
        for verdict, source in SUM[language].items():
            limits = {**SUM_LIMITS, "time_s": SLOW_START.get(language, SUM_LIMITS["time_s"])}
            limits["wall_s"] = SUM_WALL_S
            items.append(
                {
                    "id": f"{language}/{verdict}",
                    "language": language,
                    "source": source,
                    "tests": SUM_TESTS,
                    "limits": limits,
                }
            )
    return items


def sort_tests(seed: int = 7) -> list[dict[str, str]]:
    rng = random.Random(seed)
    tests = []
    for size in (1, 5, 1000):
        numbers = [rng.randint(-(10**9), 10**9) for _ in range(size)]
        stdin = f"{size}\n{' '.join(map(str, numbers))}\n"
        tests.append({"stdin": stdin, "expected": " ".join(map(str, sorted(numbers))) + "\n"})
    return tests


SORT_PY = "input()\nprint(*sorted(map(int, input().split())))\n"
SORT_CPP = (
    "#include <bits/stdc++.h>\nint main(){int n;std::cin>>n;std::vector<long> v(n);"
    "for(auto&x:v)std::cin>>x;std::sort(v.begin(),v.end());"
    "for(int i=0;i<n;i++)std::cout<<v[i]<<(i+1<n?' ':'\\n');}"
)


def big_input(megabytes: int = 10) -> tuple[str, str]:
    """About ``megabytes`` MB of numbers (one a line) and their sum."""
    rng = random.Random(11)
    numbers = [rng.randint(0, 10**9) for _ in range(megabytes * 1024 * 1024 // 10)]
    return "\n".join(map(str, numbers)) + "\n", f"{sum(numbers)}\n"


BIG_PY = "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n"
BIG_CPP = (
    '#include <cstdio>\nint main(){long long s=0,x;while(scanf("%lld",&x)==1)s+=x;'
    'printf("%lld\\n",s);}'
)

# float: n -> sqrt(n); checker float:1e-6. The near one prints 7 digits, the far one is off.
FLOAT_TESTS = [{"stdin": f"{n}\n", "expected": f"{n**0.5:.10f}\n"} for n in (2, 10, 12345)]
FLOAT_NEAR = "import math\nprint(f'{math.sqrt(int(input())):.7f}')\n"
FLOAT_FAR = "import math\nprint(f'{math.sqrt(int(input())) + 1e-3:.7f}')\n"

# special: n -> any two positive integers that sum to n (the expected output is one answer).
SPECIAL_JUDGE = """
def check(input, expected, output):
    n = int(input)
    parts = output.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return False, "want two positive integers"
    a, b = map(int, parts)
    return (a > 0 and b > 0 and a + b == n), f"{a} + {b} != {n}"
"""
SPECIAL_TESTS = [{"stdin": f"{n}\n", "expected": f"1 {n - 1}\n"} for n in (5, 10, 100)]
SPECIAL_OTHER = "n = int(input())\nprint(n // 2, n - n // 2)\n"  # another right answer
SPECIAL_WRONG = "n = int(input())\nprint(n, 0)\n"

# Submissions as other judges take them (Codeforces, DMOJ, CodeContests): Java classes of any
# name and modifiers, Go's package clause, compilers that flood or hang. Id -> (language,
# source, verdict on SUM_TESTS).
_JAVA_SUM = "{public static void main(String[] a){java.util.Scanner s=new java.util.Scanner(System.in);System.out.println(s.nextLong()+s.nextLong());}}"
FLOOD_CPP = (  # a million errors, each with five macro notes: a GB of messages, unstopped
    "#define A x();x();x();x();x();x();x();x();x();x();\n#define B A A A A A A A A A A\n"
    "#define C B B B B B B B B B B\n#define D C C C C C C C C C C\n#define E D D D D D D D D D D\n"
    "int main(){int x;E E E E E E E E E E}\n"
)
SLOW_CPP = (  # 10^10 steps of constant evaluation: minutes of g++
    "constexpr long f(){long s=0;for(long i=0;i<100000;i++)for(long j=0;j<100000;j++)s+=i^j;return s;}\n"
    "constexpr long v=f();\nint main(){return v&1;}\n"
)
BORDER_CASES: dict[str, tuple[str, str, str]] = {
    "java/Solution": ("java17", f"import java.util.*;\npublic class Solution{_JAVA_SUM}", "AC"),
    "java/final-A": ("java17", f"final class A{_JAVA_SUM}", "AC"),
    "java/abstract-strictfp": (
        "java17",
        f"public abstract strictfp class CF1234A{_JAVA_SUM}",
        "AC",
    ),
    "java/unicode": ("java17", f"public class Решение{_JAVA_SUM}", "AC"),
    "java/decoys": (
        "java17",
        '// public class Foo\n/* public class Bar { */\nclass Helper{static String s="public class Baz {";}\n'
        f"public final class Real{_JAVA_SUM}",
        "AC",
    ),
    "java/main-elsewhere": ("java17", f"public class Sol{{}}\nclass Runner{_JAVA_SUM}", "AC"),
    "java/no-main": ("java17", "public class Solution{static long f(long x){return x;}}", "RE"),
    "java/throws": (
        "java17",
        'public class Solution{public static void main(String[] a){throw new IllegalStateException("boom");}}',
        "RE",
    ),
    "kotlin/object": (
        "kotlin",
        "object Main {\n    @JvmStatic fun main(args: Array<String>) {\n        val s = java.util.Scanner(System.`in`)\n        println(s.nextLong() + s.nextLong())\n    }\n}\n",
        "AC",
    ),
    "kotlin/package": (
        "kotlin",
        'package codeforces\n\nprivate fun readLn() = readLine()!!\nfun main(args: Array<String>) {\n    val (a, b) = readLn().split(" ").map(String::toLong)\n    println(a + b)\n}\n',
        "AC",
    ),
    "csharp/namespace": (
        "csharp",
        "using System;\nusing System.Linq;\nnamespace CF {\n    public class Program {\n        public static void Main(string[] args) {\n            var v = Console.ReadLine().Split().Select(long.Parse).ToArray();\n            Console.WriteLine(v.Sum());\n        }\n    }\n}\n",
        "AC",
    ),
    "go/package-foo": ("go", "package foo\nfunc main(){}\n", "CE"),
    "go/commented-package": ("go", "// package foo\n" + SUM["go"]["AC"], "AC"),
    "cpp17/flood": ("cpp17", FLOOD_CPP, "CE"),
    "cpp17/slow-compile": ("cpp17", SLOW_CPP, "CE"),
    # javac -d . makes the package's directory in the build: was IE (the compile cache's read)
    "java/package": ("java17", f"package cf.round;\npublic class A{_JAVA_SUM}", "AC"),
    # a 2 GB array past -Xmx128m: the JVM's OutOfMemoryError at once, MLE as DMOJ says
    "java/heap": (
        "java17",
        "public class Main{public static void main(String[] a){long[] x=new long[1<<28];System.out.println(x.length);}}",
        "MLE",
    ),
    # a program's memory is its own: at 16 MB these were MLE with the runner's 16 MB
    "c/16MB": ("c", SUM["c"]["AC"], "AC"),
    "go/16MB": ("go", SUM["go"]["AC"], "AC"),
    # asleep past 3x its CPU limit (DMOJ's wall limit): TLE, not AC within 3x + 5 s
    "cpp17/asleep": (
        "cpp17",
        f"#include <unistd.h>\n{SUM['cpp17']['AC'].replace('{', '{sleep(7);', 1)}",
        "TLE",
    ),
}
# The limits of some border cases, over SUM_LIMITS.
BORDER_LIMITS: dict[str, dict[str, float]] = {
    "cpp17/slow-compile": {"compile_time_s": 2.0},
    "c/16MB": {"memory_mb": 16},
    "go/16MB": {"memory_mb": 16},
}
