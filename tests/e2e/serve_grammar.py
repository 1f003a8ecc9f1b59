"""Structured output through `kvstream serve`: response_format json_schema (the answer parsed by
Python's json and checked against the schema: jsonschema where installed, else by hand),
json_object, llama-server's `grammar` and `json_schema` fields, streaming, and the 400s that
name the field (a grammar's line and column)."""
import json
import sys

import openai

from serve_util import Server, check, fail

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "pet": {"anyOf": [{"type": "null"}, {"enum": ["cat", "dog"]}]},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def validate(doc, schema):
    """jsonschema's verdict where it is installed; else this schema's rules by hand."""
    try:
        import jsonschema
        jsonschema.validate(doc, schema)
        return
    except ImportError:
        pass
    check(isinstance(doc, dict), "not an object: %r" % (doc,))
    check(set(doc) <= set(schema["properties"]), "keys beyond the schema: %r" % (doc,))
    check({"name", "age"} <= set(doc), "a required key is missing: %r" % (doc,))
    check(isinstance(doc["name"], str) and len(doc["name"]) <= 30, "bad name: %r" % (doc,))
    check(isinstance(doc["age"], int) and not isinstance(doc["age"], bool), "bad age: %r" % (doc,))
    if "hobbies" in doc:
        h = doc["hobbies"]
        check(isinstance(h, list) and len(h) <= 3 and all(isinstance(x, str) for x in h),
              "bad hobbies: %r" % (doc,))
    if "pet" in doc:
        check(doc["pet"] in (None, "cat", "dog"), "bad pet: %r" % (doc,))


def main():
    binary, model = sys.argv[1], sys.argv[2]
    srv = Server(binary, model, "-np", "2")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        msgs = [{"role": "user", "content": "Invent a person and describe them as JSON."}]
        for temperature in (0, 0.8):
            r = client.chat.completions.create(
                model="m", messages=msgs, temperature=temperature, max_tokens=200, seed=3,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "person", "schema": SCHEMA}})
            text = r.choices[0].message.content
            check(r.choices[0].finish_reason == "stop", "ended by %s: %r" % (
                r.choices[0].finish_reason, text))
            try:
                doc = json.loads(text)
            except ValueError:
                fail("json_schema answer is not JSON: %r" % text)
            validate(doc, SCHEMA)

        # Streamed: the pieces make the same JSON as the whole answer at temperature 0.
        paris = [{"role": "user",
                  "content": "Give a JSON object with the keys city and country for Paris."}]
        whole = client.chat.completions.create(
            model="m", messages=paris, temperature=0, max_tokens=200,
            response_format={"type": "json_object"}).choices[0].message.content
        check(isinstance(json.loads(whole), dict), "json_object gave %r" % whole)
        parts = client.chat.completions.create(
            model="m", messages=paris, temperature=0, max_tokens=200, stream=True,
            response_format={"type": "json_object"})
        streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
        check(streamed == whole, "streamed %r, whole %r" % (streamed, whole))

        # llama-server's fields, on /v1/completions too.
        st, _, body = srv.http("POST", "/v1/completions", {
            "prompt": "The answer is", "max_tokens": 8, "temperature": 0,
            "grammar": "root ::= \" \" (\"yes\" | \"no\")"})
        check(st == 200 and body["choices"][0]["text"] in (" yes", " no"), "grammar: %r" % body)
        st, _, body = srv.http("POST", "/v1/chat/completions", {
            "messages": msgs, "max_tokens": 60, "temperature": 0,
            "json_schema": {"type": "array", "items": {"type": "integer"}, "minItems": 2,
                            "maxItems": 4}})
        check(st == 200, "json_schema: %r" % body)
        arr = json.loads(body["choices"][0]["message"]["content"])
        check(isinstance(arr, list) and 2 <= len(arr) <= 4 and all(type(x) is int for x in arr),
              "json_schema array: %r" % arr)

        # Refusals: 400, the field named, a grammar's place given.
        for req, param, words in [
            ({"grammar": "root ::= [a-"}, "grammar", "line 1, column 10"),
            ({"grammar": "root ::= x\nx ::= y"}, "grammar", "line 2, column 7: undefined rule 'y'"),
            ({"json_schema": {"type": "string", "pattern": "a+"}}, "json_schema", "anchored"),
            ({"json_schema": {"type": "integer", "minimum": 0}}, "json_schema", "'minimum'"),
            ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
            ({"response_format": {"type": "xml"}}, "response_format", "'xml'"),
            ({"grammar": "root ::= \"a\"", "json_schema": {}}, "json_schema", "give one of"),
        ]:
            st, _, body = srv.http("POST", "/v1/chat/completions",
                                   dict(messages=msgs, max_tokens=4, **req))
            err = body.get("error", {}) if isinstance(body, dict) else {}
            check(st == 400 and err.get("param") == param and words in err.get("message", ""),
                  "%r: %d %r" % (req, st, body))
        print("serve grammar: ok")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
