from __future__ import annotations

import json
from pathlib import Path

import pytest

from aivitals.errors import ConfigError
from aivitals.load import (
    DEMO_COMPLETIONS,
    DEMO_EMBEDDINGS,
    RequestTemplate,
    completions_request,
    embeddings_request,
    template_from_options,
)

REQUEST_YAML = """\
method: post
path: /embed
headers:
  Authorization: Bearer s3cret
body:
  inputs: "{{prompt}}"
  options: {truncate: false}
"""


def _write(tmp_path: Path, text: str, name: str = "request.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_demo_template_renders_what_validate_and_the_faults_sent_before() -> None:
    """The bytes on the wire are pinned, not just equal to a helper that might change
    along with the template."""
    spec = DEMO_EMBEDDINGS.render("hello world")
    assert spec.body == b'{"input": "hello world"}'
    assert (spec.method, spec.path, spec.headers) == (
        "POST",
        "/v1/embeddings",
        (("Content-Type", "application/json"),),
    )
    assert (spec.stream, spec.prompt_tokens, spec.expects_json) == (False, 2, True)
    assert embeddings_request("hello world") == spec
    assert embeddings_request("x", path="/other/embeddings").path == "/other/embeddings"
    assert DEMO_COMPLETIONS.render("a b c") == completions_request("a b c", 16)


def test_a_prompt_with_quotes_newlines_and_control_characters_is_escaped_as_json() -> None:
    prompt = 'say "hi"\nthen \\ leave\t\x00 café'
    t = RequestTemplate("POST", "/x", {"a": {"b": ["pre {{prompt}} post", 3]}, "n": None})
    body = t.render(prompt).body
    assert json.loads(body) == {"a": {"b": [f"pre {prompt} post", 3]}, "n": None}
    assert b"\n" not in body and b"\x00" not in body  # escaped, not raw


def test_every_placeholder_gets_the_prompt() -> None:
    t = RequestTemplate("PUT", "/x", {"q": "{{prompt}}", "echo": "{{prompt}}|{{prompt}}"})
    assert json.loads(t.render("p").body) == {"q": "p", "echo": "p|p"}
    assert t.render("p").method == "PUT"


def test_a_request_file_gives_method_path_headers_and_body(tmp_path: Path) -> None:
    t = RequestTemplate.load(_write(tmp_path, REQUEST_YAML))
    spec = t.render("one two")
    assert (spec.method, spec.path) == ("POST", "/embed")
    # JSON is assumed unless the file names another content type
    assert spec.headers == (
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer s3cret"),
    )
    assert json.loads(spec.body) == {"inputs": "one two", "options": {"truncate": False}}


def test_a_json_file_and_a_body_given_as_a_json_string_load_too(tmp_path: Path) -> None:
    doc = {"path": "/gen", "body": '{"text": "{{prompt}}"}', "headers": {"content-type": "x/y"}}
    t = RequestTemplate.load(_write(tmp_path, json.dumps(doc), "r.json"))
    assert t.method == "POST"
    assert t.headers == (("content-type", "x/y"),)
    assert json.loads(t.render("z").body) == {"text": "z"}


def test_a_template_equal_to_the_demo_s_is_the_demo_s(tmp_path: Path) -> None:
    t = RequestTemplate.load(
        _write(tmp_path, 'path: /v1/embeddings\nbody: {"input": "{{prompt}}"}\n')
    )
    assert t == DEMO_EMBEDDINGS


def test_openai_presets() -> None:
    chat = RequestTemplate.openai("chat", "llama-3-8b").render("hi")
    assert chat.path == "/v1/chat/completions"
    assert json.loads(chat.body) == {
        "model": "llama-3-8b",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
    }
    comp = RequestTemplate.openai("completions", "gpt2").render("hi")
    assert comp.path == "/v1/completions"
    assert json.loads(comp.body) == {"model": "gpt2", "prompt": "hi", "max_tokens": 16}
    assert not comp.stream and comp.expects_json


def test_render_raw_puts_bytes_unescaped_or_cuts_the_body() -> None:
    t = RequestTemplate("POST", "/x", {"m": 1, "text": "Q: {{prompt}}"})
    assert t.render_raw(b"\xff\x07").body == b'{"m": 1, "text": "Q: \xff\x07"}'
    assert t.render_raw(b"cut", truncate=True).body == b'{"m": 1, "text": "Q: cut'


def test_template_from_options_picks_one(tmp_path: Path) -> None:
    assert template_from_options(None, None, None) is DEMO_EMBEDDINGS
    assert template_from_options(None, "chat", "m").path == "/v1/chat/completions"
    path = _write(tmp_path, REQUEST_YAML)
    assert template_from_options(path, None, None).path == "/embed"


# -- bad input ------------------------------------------------------------------------
def test_a_file_without_the_placeholder_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, 'path: /embed\nbody: {"inputs": "always the same"}\n')
    with pytest.raises(ConfigError, match=r"request\.yaml.*no \{\{prompt\}\} placeholder"):
        RequestTemplate.load(path)


def test_the_placeholder_as_a_key_is_not_a_slot(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="placeholder"):
        RequestTemplate("POST", "/x", {"{{prompt}}": 1})


@pytest.mark.parametrize(
    "text,match",
    [
        ("path: /x\nbody: [unclosed\n", "not valid YAML or JSON"),
        ("- a list\n", "expected a mapping"),
        ('path: /x\nbody: \'{"a": "{{prompt}}"\'\n', "body is not valid JSON"),
        ('body: {"a": "{{prompt}}"}\n', "'path' is missing"),
        ("path: /x\n", "'body' is missing"),
        ('path: /x\nurl: y\nbody: {"a": "{{prompt}}"}\n', r"unknown keys \['url'\]"),
        ('path: /x\nheaders: [a]\nbody: {"a": "{{prompt}}"}\n', "headers must be a mapping"),
        ('path: /x\nbody: ["{{prompt}}"]\n', "body must be a JSON object"),
        ('method: FETCH\npath: /x\nbody: {"a": "{{prompt}}"}\n', "method 'FETCH' is not one"),
        ('method: GET\npath: /x\nbody: {"a": "{{prompt}}"}\n', "method 'GET' is not one"),
        ('path: v1/embed\nbody: {"a": "{{prompt}}"}\n', "must start with '/'"),
        ('path: /a b\nbody: {"a": "{{prompt}}"}\n', "holds whitespace"),
        (
            'path: /x\nheaders: {"X-A": "b\\r\\nEvil: 1"}\nbody: {"a": "{{prompt}}"}\n',
            "not a valid header",
        ),
    ],
)
def test_a_bad_request_file_is_refused_naming_it(tmp_path: Path, text: str, match: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as err:
        RequestTemplate.load(path)
    assert str(path) in str(err.value)


def test_an_unreadable_request_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml.*cannot read it"):
        RequestTemplate.load(tmp_path / "missing.yaml")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"path: /\xe9\n")
    with pytest.raises(ConfigError, match="cannot read it"):
        RequestTemplate.load(bad)


def test_openai_needs_a_model_and_a_known_kind() -> None:
    with pytest.raises(ConfigError, match="--openai chat needs --model"):
        template_from_options(None, "chat", None)
    with pytest.raises(ConfigError, match="'embeddings' is not one of completions, chat"):
        RequestTemplate.openai("embeddings", "m")
    with pytest.raises(ConfigError, match="give --openai too"):
        template_from_options(None, None, "m")


def test_request_and_openai_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not both"):
        template_from_options(_write(tmp_path, REQUEST_YAML), "chat", "m")
