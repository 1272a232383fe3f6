"""The Dockerfile parser: Docker's syntax, mapped onto template build steps."""

from __future__ import annotations

import pytest

from aenv.dockerfile import CopySource, DockerfileError, Step, parse, substitute


def test_full_example() -> None:
    df = parse(
        """
        # syntax comment
        ARG BASE=base
        FROM ${BASE} AS build
        ARG VERSION=1.2
        ENV APP_HOME=/srv/app \\
            GREETING="hello world"
        WORKDIR $APP_HOME
        COPY --chown=user:user --chmod=755 app/ ./
        COPY a.txt b.txt data/
        RUN apt-get update && \\
        # a comment inside a continuation
            echo $VERSION
        RUN ["python3", "-c", "print(1)"]
        USER user
        EXPOSE 8080
        CMD ["python3", "-m", "http.server"]
        """,
        build_args={"VERSION": "2.0"},
    )
    assert df.base == "base"
    assert df.steps == [
        Step("ARG", ("VERSION=2.0",), 5),
        Step("ENV", ("APP_HOME", "/srv/app", "GREETING", "hello world"), 6),
        Step("WORKDIR", ("/srv/app",), 8),
        Step("COPY", ("app/", "./", "user:user", "0755"), 9, CopySource("app/", "./")),
        Step("COPY", ("a.txt", "data/", "", ""), 10, CopySource("a.txt", "data/")),
        Step("COPY", ("b.txt", "data/", "", ""), 10, CopySource("b.txt", "data/")),
        # Docker keeps a continued line's indentation (the comment line inside is dropped)
        Step("RUN", ("apt-get update &&             echo $VERSION",), 11),
        Step("RUN", ("python3 -c 'print(1)'",), 14),
        Step("USER", ("user",), 15),
    ]
    assert df.start_cmd == "python3 -m http.server"
    assert df.warnings and "EXPOSE" in df.warnings[0]


def test_legacy_env_and_an_unknown_instruction_named_by_its_line() -> None:
    df = parse("FROM base\nENV PATH_X /opt/x y\n")
    assert df.steps[0] == Step("ENV", ("PATH_X", "/opt/x y"), 2)
    with pytest.raises(DockerfileError, match="line 3: unknown instruction: FROBNICATE"):
        parse("FROM base\nENV PATH_X /opt/x y\nFROBNICATE now\n")


def test_heredocs() -> None:
    """`RUN <<EOF` runs the body as the script; after a command the heredoc is its input
    (the build sandbox's bash reads it); `<<-` strips leading tabs; quoting the terminator
    keeps `$` literal, as the shell does."""
    df = parse(
        "FROM base\n"
        "RUN <<EOF\necho one\necho two\nEOF\n"
        "RUN cat > /etc/motd <<'EOT'\nhello $USER\nEOT\n"
        "RUN <<-EOF\n\techo tabbed\n\tEOF\n"
    )
    assert [s.args[0] for s in df.steps] == [
        "echo one\necho two\n",
        "cat > /etc/motd <<'EOT'\nhello $USER\nEOT\n",
        "echo tabbed\n",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("RUN echo\n", "before FROM"),
        ("# nothing\n", "no FROM"),
        ("FROM a\nFROM b\n", "multi-stage"),
        ("FROM a\nCOPY --from=x /a /b\n", "--from"),
        ("FROM a\nADD https://x.org/f /f\n", "URL"),
        ("FROM a\nCOPY ../secret /x\n", "inside the context"),
        ("FROM a\nCOPY onlyone\n", "source and a destination"),
        ("FROM a\nENV A=1 B\n", "name=value"),
    ],
)
def test_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(DockerfileError, match=message):
        parse(text)


def test_substitution_forms() -> None:
    env = {"A": "1", "E": ""}
    assert substitute("$A-${A}-${B:-d}-${A:+set}-${E:-empty}-\\$A", env) == "1-1-d-set-empty-$A"
