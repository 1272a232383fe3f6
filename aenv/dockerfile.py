"""Dockerfile → template build spec (pure: no I/O, unit-tested).

What a template build can do: one `FROM` (a template name, or an image), then RUN, COPY/ADD
(from the build context), ENV, ARG, WORKDIR, USER; `CMD`/`ENTRYPOINT` become the start
command. The text is read by the maintained parser the E2B SDK itself depends on
(`e2b-dockerfile-utils`: line continuations, comments, parser directives, heredocs); this
module gives the instructions their meaning: JSON (exec) and shell forms, `RUN <<EOF`
heredocs (the body alone is the script; after a command it is that command's input),
`$VAR`/`${VAR}`/`${VAR:-x}`/`${VAR:+x}` substitution from ARG and ENV in FROM, COPY, ENV,
ARG, WORKDIR and USER (RUN sees ARGs as environment variables, like Docker),
`COPY --chown/--chmod`.

Instructions that describe a container runtime (EXPOSE, LABEL, VOLUME, …) are skipped with
a warning; unknown ones are passed on as steps so the build fails naming them; things we
cannot do (multi-stage builds, `COPY --from`, `ADD <url>`) are errors here.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

__all__ = ["CopySource", "Dockerfile", "DockerfileError", "Step", "parse"]

IGNORED = {
    "LABEL",
    "EXPOSE",
    "VOLUME",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
    "ONBUILD",
    "MAINTAINER",
}
_VAR = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:[-+])(?P<word>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


class DockerfileError(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"Dockerfile line {line}: {message}")
        self.line = line


@dataclass(frozen=True)
class Step:
    """One build step in E2B's wire shape (`type`, `args`); COPY steps also carry where
    their files come from (`copy`) so the client can hash and upload them."""

    type: str
    args: tuple[str, ...]
    line: int
    copy: CopySource | None = None


@dataclass(frozen=True)
class CopySource:
    src: str
    dest: str


@dataclass
class Dockerfile:
    base: str
    steps: list[Step] = field(default_factory=list)
    start_cmd: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Instruction:
    line: int
    keyword: str
    rest: str  # the arguments as written (continuations joined), heredoc bodies apart
    heredocs: tuple[tuple[str, str], ...] = ()  # (terminator, body)


def _instructions(text: str) -> tuple[list[_Instruction], list[str]]:
    """The Dockerfile's instructions and the parser's warnings."""
    from e2b_dockerfile_utils import DockerfileSyntaxError, parse_dockerfile_ast

    try:
        ast = parse_dockerfile_ast(text)
    except DockerfileSyntaxError as e:
        reason = re.sub(r"^Dockerfile parse error( on line \d+)?: ", "", str(e))
        raise DockerfileError(e.line or 1, reason) from e
    out = []
    for ins in ast.instructions:
        original = ins.original.strip()
        rest = original[len(ins.name) :].strip() if original.upper().startswith(ins.name) else ""
        docs = tuple((h.name, _chomp(h.content) if h.chomp else h.content) for h in ins.heredocs)
        out.append(_Instruction(ins.start_line, ins.name.upper(), rest, docs))
    warnings = [
        f"line {w.line}: {w.message}" if getattr(w, "line", None) else str(w)
        for w in getattr(ast, "warnings", [])
    ]
    return out, warnings


def _chomp(body: str) -> str:
    return "".join(line.lstrip("\t") for line in body.splitlines(keepends=True))


_HEREDOC_ONLY = re.compile(r"^(?:<<-?\s*['\"]?[A-Za-z_][A-Za-z0-9_]*['\"]?\s*)+$")


def _run_command(rest: str, heredocs: tuple[tuple[str, str], ...]) -> str:
    """The shell command of a RUN: as written, or from its heredocs — `RUN <<EOF` alone runs
    the body as the script (Docker's meaning); `RUN cmd <<EOF` keeps the heredoc for the
    shell that runs `cmd` (bash reads it as that command's input)."""
    if not heredocs:
        return _command(rest)
    if _HEREDOC_ONLY.match(rest):
        return "".join(body for _, body in heredocs)
    return rest + "\n" + "".join(f"{body}{name}\n" for name, body in heredocs)


def substitute(value: str, env: dict[str, str]) -> str:
    """Docker's variable expansion (`\\$` escapes a dollar)."""

    def repl(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("plain")
        current = env.get(name)
        op = m.group("op")
        if op == ":-":
            return current if current else m.group("word")
        if op == ":+":
            return m.group("word") if current else ""
        return current or ""

    parts = value.split("\\$")
    return "$".join(_VAR.sub(repl, p) for p in parts)


def _json_form(rest: str) -> list[str] | None:
    if not rest.startswith("["):
        return None
    try:
        value = json.loads(rest)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _flags(rest: str) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        key, _, value = word[2:].partition("=")
        flags[key] = value
        rest = rest.lstrip()
    return flags, rest


def _key_values(rest: str, line: int, what: str) -> list[tuple[str, str]]:
    """ENV/ARG/LABEL `k=v k2="v 2"`, or the legacy `ENV k value with spaces`."""
    try:
        words = shlex.split(rest, posix=True)
    except ValueError as e:
        raise DockerfileError(line, f"{what}: {e}") from e
    if not words:
        raise DockerfileError(line, f"{what} needs arguments")
    if "=" not in words[0]:
        if what == "ARG":
            return [(w.partition("=")[0], w.partition("=")[2]) for w in words]
        key, _, value = rest.partition(" ")
        return [(key, value.strip())]
    pairs = []
    for w in words:
        if "=" not in w:
            raise DockerfileError(line, f"{what}: expected key=value, got {w!r}")
        k, v = w.split("=", 1)
        pairs.append((k, v))
    return pairs


def _command(rest: str) -> str:
    exec_form = _json_form(rest)
    return shlex.join(exec_form) if exec_form is not None else rest


def parse(text: str, build_args: dict[str, str] | None = None) -> Dockerfile:
    """The build spec of a Dockerfile; `build_args` override ARG defaults (`--build-arg`)."""
    instructions, warnings = _instructions(text)
    parser = _Parser(dict(build_args or {}))
    for ins in instructions:
        parser.take(ins)
    return parser.result(warnings)


class _Parser:
    """What the instructions so far have set: the ARGs and ENVs in scope (they substitute
    in later instructions), the spec being built and its start command's two halves."""

    def __init__(self, overrides: dict[str, str]) -> None:
        self.overrides = overrides
        self.args: dict[str, str] = {}  # ARGs in scope
        self.env: dict[str, str] = {}
        self.df: Dockerfile | None = None
        self.entrypoint: str | None = None
        self.cmd: str | None = None

    def take(self, ins: _Instruction) -> None:
        scope = {**self.args, **self.env}
        if ins.keyword == "FROM":
            self._from(ins, scope)
        elif ins.keyword == "ARG":
            self._arg(ins, scope)
        elif self.df is None:
            raise DockerfileError(ins.line, f"{ins.keyword} before FROM")
        else:
            self._step(self.df, ins, scope)

    def result(self, warnings: list[str]) -> Dockerfile:
        df = self.df
        if df is None:
            raise DockerfileError(1, "no FROM instruction")
        df.warnings[:0] = warnings
        if self.entrypoint or self.cmd:
            df.start_cmd = " ".join(p for p in (self.entrypoint, self.cmd) if p)
        return df

    def _from(self, ins: _Instruction, scope: dict[str, str]) -> None:
        if self.df is not None:
            raise DockerfileError(ins.line, "multi-stage builds (a second FROM) are not supported")
        _, rest = _flags(ins.rest)  # --platform: the guest's is the only one
        words = substitute(rest, scope).split()
        if (
            not words
            or (len(words) not in (1, 3))
            or (len(words) == 3 and words[1].upper() != "AS")
        ):
            raise DockerfileError(ins.line, "FROM needs an image or template (FROM x [AS name])")
        self.df = Dockerfile(base=words[0])
        self.args = {}  # ARGs before FROM are only visible to FROM

    def _arg(self, ins: _Instruction, scope: dict[str, str]) -> None:
        for k, v in _key_values(ins.rest, ins.line, "ARG"):
            self.args[k] = self.overrides.get(k, substitute(v, scope))
            if self.df is not None:
                self.df.steps.append(Step("ARG", (f"{k}={self.args[k]}",), ins.line))

    def _step(self, df: Dockerfile, ins: _Instruction, scope: dict[str, str]) -> None:
        line, keyword, rest = ins.line, ins.keyword, ins.rest
        match keyword:
            case "RUN":
                if not rest:
                    raise DockerfileError(line, "RUN needs a command")
                _, rest = _flags(rest)  # --mount/--network: no meaning in a build sandbox
                df.steps.append(Step("RUN", (_run_command(rest, ins.heredocs),), line))
            case "ENV":
                pairs = [(k, substitute(v, scope)) for k, v in _key_values(rest, line, "ENV")]
                self.env.update(pairs)
                df.steps.append(Step("ENV", tuple(x for kv in pairs for x in kv), line))
            case "WORKDIR" | "USER":
                if not rest:
                    raise DockerfileError(line, f"{keyword} needs {_NEEDS[keyword]}")
                df.steps.append(Step(keyword, (substitute(rest, scope),), line))
            case "COPY" | "ADD":
                df.steps.extend(_copy(keyword, rest, line, scope))
            case "CMD":
                self.cmd = _command(rest)
            case "ENTRYPOINT":
                self.entrypoint = _command(rest)
            case _ if keyword in IGNORED:
                df.warnings.append(f"line {line}: {keyword} has no effect on a template; skipped")
            case _:
                df.steps.append(Step(keyword, (rest,), line))


#: What an instruction that takes one argument is missing when it has none.
_NEEDS = {"WORKDIR": "a path", "USER": "a user name"}


def _copy(keyword: str, rest: str, line: int, scope: dict[str, str]) -> list[Step]:
    flags, rest = _flags(rest)
    if "from" in flags:
        raise DockerfileError(line, f"{keyword} --from (multi-stage builds) is not supported")
    exec_form = _json_form(rest)
    try:
        words = exec_form if exec_form is not None else shlex.split(rest)
    except ValueError as e:
        raise DockerfileError(line, f"{keyword}: {e}") from e
    words = [substitute(w, scope) for w in words]
    if len(words) < 2:
        raise DockerfileError(line, f"{keyword} needs a source and a destination")
    *sources, dest = words
    for src in sources:
        if re.match(r"^[a-z]+://", src):
            raise DockerfileError(line, f"{keyword} from a URL ({src}) is not supported")
        if src.startswith("/") or src == ".." or src.startswith("../"):
            raise DockerfileError(line, f"{keyword} {src}: sources must be inside the context")
    chown = substitute(flags.get("chown", ""), scope)
    chmod = flags.get("chmod", "")
    if chmod and not re.fullmatch(r"[0-7]{3,4}", chmod):
        raise DockerfileError(line, f"{keyword} --chmod={chmod}: use octal digits")
    if len(sources) > 1 and not dest.endswith("/"):
        dest += "/"
    return [
        Step(
            "COPY",
            (src, dest, chown, chmod.zfill(4) if chmod else ""),
            line,
            copy=CopySource(src, dest),
        )
        for src in sources
    ]
