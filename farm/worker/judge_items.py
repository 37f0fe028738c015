"""A worker's side of judge items: the item's problem (inline, or stored: ``stored_problems``)
made into its judge step, the compile cache and the special judge around the item's one kernel
round trip (``BatchRunner``'s), and its groups' score.

Invariants: inline and stored problems take one path (``farm.judge.specs.build_step``); a
problem not stored is the item's ``input`` error; the cache (language, source with its compile
options and build-directory files, image digest) compiles a submission once per worker,
compile errors included; a special judge runs in a box of its own; at most
``judge_parallel`` items are judged at once (``parallel``). docs/design/judge.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from farm.errors import ProblemError, ProblemNotFound
from farm.judge.problems import Problem
from farm.judge.scoring import scored
from farm.judge.specs import BUILD_DIR, build_step
from farm.kernel.wire.protocol import JudgeProgram
from farm.models.batch import Chunk, ChunkItem, ItemDone
from farm.models.frames import JudgeStep
from farm.models.judge import JudgeResult, Verdict
from farm.worker.stored_problems import StoredProblems

if TYPE_CHECKING:
    import redis

    from farm.sandbox.sandbox_keeper import SandboxKeeper
    from farm.settings import FarmSettings

CACHE_BYTES = 256 << 20
RunItem = Callable[[Chunk, ChunkItem], ItemDone]

# The special judge's box runs this cell after the checker's code (``check``) was loaded.
SPECIAL_DRIVER = """
import json as _json
_verdicts = []
for _test in _json.load(open(".judge-special/tests.json")):
    _said = check(_test["input"], _test["expected"], _test["output"])
    _ok, _why = (_said, "") if isinstance(_said, bool) else (bool(_said[0]), str(_said[1]))
    _verdicts.append([_ok, _why])
print("FARM-SPECIAL " + _json.dumps(_verdicts))
"""


class CompileCache:
    """Builds (file name -> base64) or compile errors by (language, source, image), least
    recently used out first past ``CACHE_BYTES``."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.limit = limit
        self.entries: OrderedDict[str, tuple[int, dict[str, str] | JudgeResult]] = OrderedDict()
        self.size = 0
        self.hits = 0
        self.lock = threading.Lock()

    @staticmethod
    def key(
        language: str,
        source: str,
        image: str,
        options: Sequence[str] = (),
        build_files: Mapping[str, str] | None = None,
    ) -> str:
        """The build's key: its compile ``options`` and the item's files in the build directory
        (a build's artifact holds them: another item's must not be restored over them) too."""
        hashed = hashlib.sha256(source.encode())
        if options or build_files:
            extra = {"options": list(options), "files": dict(sorted((build_files or {}).items()))}
            hashed.update(b"\0" + json.dumps(extra).encode())
        return f"{language}:{hashed.hexdigest()}:{image}"

    def get(self, key: str) -> dict[str, str] | JudgeResult | None:
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                return None
            self.entries.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, key: str, value: dict[str, str] | JudgeResult) -> None:
        size = (
            sum(len(data) for data in value.values())
            if isinstance(value, dict)
            else len(value.message)
        )
        with self.lock:
            if key in self.entries or size > self.limit:
                return
            self.entries[key] = (size, value)
            self.size += size
            while self.size > self.limit:
                _, (old, _) = self.entries.popitem(last=False)
                self.size -= old


class Judging:
    def __init__(
        self, settings: FarmSettings, keeper: SandboxKeeper, worker_id: str, client: redis.Redis
    ) -> None:
        self.settings = settings
        self.keeper = keeper  # whose image's digest keys the cache
        self.worker_id = worker_id
        self.cache = CompileCache()
        self.lock = threading.Lock()
        self.building: dict[str, threading.Event] = {}  # program key -> built (or given up)
        self.problems = StoredProblems(client)

    def run(self, chunk: Chunk, item: ChunkItem, run_item: RunItem) -> ItemDone:
        """Judge ``item`` (its ``submission``, on its problem), then score its groups."""
        submission = item.submission
        assert submission is not None
        try:
            problem = (
                submission.problem
                if isinstance(submission.problem, Problem)
                else self.problems.get(submission.problem)
            )
        except (ProblemNotFound, ProblemError) as exc:
            refused = JudgeResult(verdict=Verdict.IE, kind="input", message=str(exc))
            done = ItemDone(key=item.key, exec_id=item.exec_id, worker=self.worker_id)
            done.judge = refused
            return done
        spec, files, timeout_s = build_step(problem, submission)
        step = {"judge": spec, "files": files, "timeout_s": timeout_s}
        item = item.model_copy(update={**step, "special_judge": problem.special_judge})
        done = self._judge(chunk, item, run_item)
        if done.judge is not None:
            done.judge = scored(done.judge, problem.groups)
        return done

    def _judge(self, chunk: Chunk, item: ChunkItem, run_item: RunItem) -> ItemDone:
        """Judge ``item`` (its ``judge`` step) with the cache, then its special judge."""
        spec = item.judge
        assert spec is not None
        image = self.keeper.info().image_digest or self.settings.image
        in_build = {k: v for k, v in item.files.items() if k.startswith(f"{BUILD_DIR}/")}
        options = spec.get("compile_options") or ()
        key = CompileCache.key(spec["language"], spec["source"], image, options, in_build)
        cached = self.cache.get(key)
        if isinstance(cached, JudgeResult):  # a compile error, the same again
            result = cached.model_copy(deep=True)
            if result.compile is not None:
                result.compile.cached = True
            return ItemDone(key=item.key, exec_id=item.exec_id, worker=self.worker_id, judge=result)
        if cached is not None:
            item = item.model_copy(update={"judge": {**spec, "artifact": cached}})
        step, owned = self._programs(item, image)
        item = item.model_copy(update={"judge": step})
        built = None
        try:
            done = run_item(chunk, item)
            built = done.judge.program_artifacts if done.judge is not None else None
        finally:  # the items waiting for these programs' builds find them cached, or build
            self._built(owned, built)
        if done.judge is None:
            return done  # the kernel failed: the cells say how
        result = done.judge
        if result.artifact is not None:
            self.cache.put(key, result.artifact)
        elif result.verdict == Verdict.CE:
            self.cache.put(key, result)
        result.artifact = result.program_artifacts = None
        if any(t.verdict == Verdict.PENDING for t in result.tests):
            done.judge = result = self._special(chunk, item, result, run_item)
        if not spec.get("keep_outputs"):  # a special judge's, not the caller's
            for test in result.tests:
                test.output = None
        return done

    def _programs(self, item: ChunkItem, image: str) -> tuple[JudgeStep, dict[str, str]]:
        """The item's judge step with its checker's and interactor's builds when cached, and
        the cache keys of those this item builds, by the kernel's name. They are
        compiled once per problem on this worker: while an item builds one, the others of
        the problem wait for its build rather than compile it too."""
        assert item.judge is not None
        spec: JudgeStep = {**item.judge}
        owned: dict[str, str] = {}
        for role, program in (
            ("checker", spec.get("checker_program")),
            ("interactor", spec.get("interactor")),
        ):
            if program is None:
                continue
            key = "program:" + CompileCache.key(program["language"], program["source"], image)
            cached = self._build_of(key, item.timeout_s)
            if cached is None:
                owned[role] = key
            elif isinstance(cached, dict):
                built: JudgeProgram = {**program, "artifact": cached}
                if role == "checker":
                    spec["checker_program"] = built
                else:
                    spec["interactor"] = built
        return spec, owned

    def _build_of(self, key: str, timeout_s: float) -> dict[str, str] | JudgeResult | None:
        """A program's cached build; ``None`` when this item is to build it (none cached, or
        the item building it gave up or failed), after waiting for another item building it."""
        while True:
            with self.lock:
                cached = self.cache.get(key)
                if cached is not None:
                    return cached
                event = self.building.get(key)
                if event is None:
                    self.building[key] = threading.Event()
                    return None
            if not event.wait(timeout_s):
                return None

    def _built(self, owned: dict[str, str], builds: dict[str, dict[str, str]] | None) -> None:
        """Cache the builds of the programs this item built and wake those waiting for them."""
        for name, key in owned.items():
            if builds and name in builds:
                self.cache.put(key, builds[name])
            with self.lock:
                event = self.building.pop(key, None)
            if event is not None:
                event.set()

    def _special(
        self, chunk: Chunk, item: ChunkItem, result: JudgeResult, run_item: RunItem
    ) -> JudgeResult:
        """The checker's verdicts on the tests that ran to their end, from a box of its own."""
        spec = item.judge
        assert spec is not None and item.special_judge is not None
        pending = [t for t in result.tests if t.verdict == Verdict.PENDING]
        tests = []
        for test in pending:
            given = spec["tests"][test.index]
            stdin = (
                base64.b64decode(given["stdin"]).decode(errors="replace")
                if "stdin" in given
                else item.files.get(given.get("stdin_path", ""), "")
            )
            expected = base64.b64decode(given.get("expected", "")).decode(errors="replace")
            output = base64.b64decode(test.output or "").decode(errors="replace")
            tests.append({"input": stdin, "expected": expected, "output": output})
        checker = ChunkItem(
            key=item.key,
            exec_id=f"{item.exec_id}-special",
            cells=[item.special_judge, SPECIAL_DRIVER],
            files={".judge-special/tests.json": json.dumps(tests)},
            timeout_s=item.timeout_s,
        )
        done = run_item(chunk, checker)
        last = done.cells[-1] if done.cells else None
        said = None
        if last is not None and last.ok:
            lines = [x for x in last.stdout.splitlines() if x.startswith("FARM-SPECIAL ")]
            said = json.loads(lines[-1].removeprefix("FARM-SPECIAL ")) if lines else None
        if said is None:
            why = f"{last.error.ename}: {last.error.evalue}" if last and last.error else "no answer"
            return result.model_copy(
                update={"verdict": Verdict.IE, "kind": "input", "message": f"special judge: {why}"}
            )
        for test, (ok, why) in zip(pending, said, strict=True):
            test.verdict = Verdict.AC if ok else Verdict.WA
            test.message = why
        verdict = Verdict.AC
        kept = []
        for test in result.tests:
            kept.append(test)
            if test.verdict != Verdict.AC:
                verdict = test.verdict
                if not spec.get("all_tests"):
                    break
        if spec.get("all_tests"):
            verdict = next((t.verdict for t in result.tests if t.verdict != Verdict.AC), verdict)
        message = next((t.message for t in kept if t.verdict != Verdict.AC), "")
        return result.model_copy(update={"verdict": verdict, "tests": kept, "message": message})


def parallel(settings: FarmSettings) -> int:
    """Judge items a worker runs at once: ``judge_parallel``, else twice its sandbox's CPUs
    (timing needs cores: a judge runs few items at once, unlike a map)."""
    return settings.judge_parallel or max(1, math.ceil(settings.limits.cpus * 2))
