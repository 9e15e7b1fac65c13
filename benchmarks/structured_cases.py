"""The cases of benchmarks/structured_backends.py: G1's schemas and their documents, G3's JSON
Schema features (a valid and a violating document each), G4's other grammar kinds."""
from __future__ import annotations

import random


# --------------------------------------------------------------------------- #
# G1 schemas and their documents
# --------------------------------------------------------------------------- #

FIRST = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Fatima", "Giulia", "Hiro", "Ines", "José", "Kofi", "Lena"]
LAST = ["Smith", "Okafor", "Nakamura", "Rossi", "García", "Müller", "Dubois", "Kowalski", "Haddad", "Lee"]
WORDS = ["urgent", "gift", "fragile", "express", "bulk", "repeat", "priority", "eco", "wholesale", "sample"]
STREETS = ["Main Street", "Elm Road", "Harbour Way", "Station Lane", "Kings Avenue", "Mill Close"]
CITIES = ["Lisbon", "Austin", "Nairobi", "Osaka", "Leeds", "Montreal", "Turin", "Accra"]

SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 60},
            "email": {"type": "string"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "editor", "viewer", "guest"]},
            "active": {"type": "boolean"},
            "score": {"type": "number"},
        },
        "required": ["name", "email", "age", "role", "active", "score"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "order_id": {"type": "integer"},
            "customer": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "address": {
                        "type": "object",
                        "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                       "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["street", "city", "zip"],
                    },
                },
                "required": ["name", "address"],
            },
            "items": {
                "type": "array",
                "items": {"type": "object",
                          "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"},
                                         "price": {"type": "number"}},
                          "required": ["sku", "quantity", "price"]},
                "minItems": 1,
            },
            "tags": {"type": "array", "items": {"type": "string"}},
            "status": {"enum": ["pending", "paid", "shipped"]},
        },
        "required": ["order_id", "customer", "items", "tags", "status"],
    },
    "refs": {
        "$defs": {
            "person": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                       "required": ["name", "email"]},
            "card": {"type": "object",
                     "properties": {"type": {"const": "card"}, "number": {"type": "string", "pattern": "^[0-9]{16}$"},
                                    "expiry": {"type": "string", "pattern": "^[0-9]{2}/[0-9]{2}$"}},
                     "required": ["type", "number", "expiry"]},
            "bank": {"type": "object",
                     "properties": {"type": {"const": "bank"}, "iban": {"type": "string"}, "bic": {"type": "string"}},
                     "required": ["type", "iban", "bic"]},
        },
        "type": "object",
        "properties": {
            "author": {"$ref": "#/$defs/person"},
            "reviewers": {"type": "array", "items": {"$ref": "#/$defs/person"}},
            "payment": {"anyOf": [{"$ref": "#/$defs/card"}, {"$ref": "#/$defs/bank"}]},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["author", "reviewers", "payment", "note"],
    },
}


def _person(rng):
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return {"name": f"{first} {last}", "email": f"{first.lower()}.{rng.randrange(100)}@example.com"}


def make_doc(kind: str, rng: random.Random) -> dict:
    if kind == "flat":
        p = _person(rng)
        return {"name": p["name"], "email": p["email"], "age": rng.randrange(18, 90),
                "role": rng.choice(["admin", "editor", "viewer", "guest"]), "active": rng.random() < 0.5,
                "score": round(rng.uniform(0, 100), 2)}
    if kind == "nested":
        return {"order_id": rng.randrange(10000, 999999),
                "customer": {"name": _person(rng)["name"],
                             "address": {"street": f"{rng.randrange(1, 300)} {rng.choice(STREETS)}",
                                         "city": rng.choice(CITIES), "zip": f"{rng.randrange(100000):05d}"}},
                "items": [{"sku": f"SKU-{rng.randrange(10000):04d}", "quantity": rng.randrange(1, 20),
                           "price": round(rng.uniform(1, 500), 2)} for _ in range(rng.randrange(1, 4))],
                "tags": rng.sample(WORDS, rng.randrange(0, 3)),
                "status": rng.choice(["pending", "paid", "shipped"])}
    if kind == "refs":
        if rng.random() < 0.5:
            payment = {"type": "card", "number": "".join(str(rng.randrange(10)) for _ in range(16)),
                       "expiry": f"{rng.randrange(1, 13):02d}/{rng.randrange(26, 35)}"}
        else:
            payment = {"type": "bank", "iban": f"DE{rng.randrange(10**18, 10**19)}", "bic": "DEUTDEFF"}
        note = rng.choice([None, "Please review by Friday.", "Second round after the fixes."])
        return {"author": _person(rng), "reviewers": [_person(rng) for _ in range(rng.randrange(1, 3))],
                "payment": payment, "note": note}
    raise ValueError(kind)


# --------------------------------------------------------------------------- #
# G3 features: (name, schema, valid document, violating document)
# --------------------------------------------------------------------------- #

def _obj(props, required=None, **kw):
    return {"type": "object", "properties": props, "required": list(props) if required is None else required, **kw}


INT, STR = {"type": "integer"}, {"type": "string"}
FEATURES = [
    ("enum", {"enum": ["red", "green", "blue"]}, "green", "purple"),
    ("const", _obj({"v": {"const": "x1"}}), {"v": "x1"}, {"v": "x2"}),
    ("anyOf", {"anyOf": [INT, {"type": "string", "maxLength": 3}]}, "ab", True),
    ("oneOf", {"oneOf": [INT, {"type": "boolean"}]}, 5, "x"),
    ("allOf", {"allOf": [_obj({"a": INT}), _obj({"b": STR})]}, {"a": 1, "b": "x"}, {"a": 1}),
    ("$ref/$defs", {"$defs": {"pt": _obj({"x": INT, "y": INT})}, **_obj({"p": {"$ref": "#/$defs/pt"}})},
     {"p": {"x": 1, "y": 2}}, {"p": {"x": 1}}),
    ("recursive $ref", {"$defs": {"node": _obj({"v": INT,
                                                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}})},
                        "$ref": "#/$defs/node"},  # the valid document nests 4 deep
     {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3, "kids": [{"v": 4, "kids": []}]}]}]},
     {"v": 1, "kids": [{"v": "x", "kids": []}]}),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "ABC-1234", "AB-12345"),
    ("format date-time", {"type": "string", "format": "date-time"}, "2024-05-01T12:30:00Z", "2024-13-01 noon"),
    ("format date", {"type": "string", "format": "date"}, "2024-05-01", "May 1st"),
    ("format email", {"type": "string", "format": "email"}, "ann@example.com", "ann.example.com"),
    ("format uuid", {"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b"),
    ("minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 5}, "abc", "abcdefg"),
    ("minimum/maximum", {"type": "integer", "minimum": 1, "maximum": 10}, 7, 42),
    ("exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}, 0.5, 0),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, 35, 36),
    ("minItems/maxItems", {"type": "array", "items": INT, "minItems": 2, "maxItems": 3}, [1, 2], [1, 2, 3, 4]),
    ("uniqueItems", {"type": "array", "items": INT, "uniqueItems": True}, [1, 2, 3], [1, 1]),
    ("additionalProperties false", _obj({"a": INT}, additionalProperties=False), {"a": 1}, {"a": 1, "b": 2}),
    ("additionalProperties schema", _obj({"a": INT}, additionalProperties=STR), {"a": 1, "b": "x"}, {"a": 1, "b": 2}),
    ("patternProperties", {"type": "object", "patternProperties": {"^x_": INT}, "additionalProperties": False},
     {"x_a": 1}, {"x_a": "s"}),
    ("minProperties/maxProperties", {"type": "object", "additionalProperties": INT, "minProperties": 1,
                                     "maxProperties": 2}, {"a": 1}, {"a": 1, "b": 2, "c": 3}),
    ("prefixItems", {"type": "array", "prefixItems": [STR, INT], "items": False}, ["a", 1], [1, "a"]),
    ("required subset", _obj({"a": INT, "b": INT}, required=["a"]), {"a": 1}, {"b": 2}),
    ("type array [string, null]", _obj({"n": {"type": ["string", "null"]}}), {"n": None}, {"n": 5}),
    ("nested depth 5", _obj({"a": _obj({"b": _obj({"c": _obj({"d": _obj({"e": INT})})})})}),
     {"a": {"b": {"c": {"d": {"e": 1}}}}}, {"a": {"b": {"c": {"d": {"e": "x"}}}}}),
    ("propertyNames", {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": INT},
     {"ab": 1}, {"A1": 1}),
    ("dependentRequired", {"type": "object", "properties": {"card": STR, "zip": STR},
                           "dependentRequired": {"card": ["zip"]}}, {"card": "x", "zip": "y"}, {"card": "x"}),
    ("if/then/else", {**_obj({"kind": {"enum": ["a", "b"]}, "n": INT}),
                      "if": {"properties": {"kind": {"const": "a"}}},
                      "then": {"properties": {"n": {"minimum": 10}}}, "else": {"properties": {"n": {"maximum": 0}}}},
     {"kind": "a", "n": 15}, {"kind": "a", "n": -5}),
    ("not", {"type": "integer", "not": {"const": 3}}, 4, 3),
]

# G4: (name, kind, spec per backend or one for all, valid text, violating text)
LARK_ARITH = 'start: expr\nexpr: term (("+" | "-") term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/\n'
GBNF_ARITH = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"\n'
OTHER_SPECS = [
    ("regex", "regex", r"[0-9]{3}-[a-z]+", "123-abc", "12-abc"),
    ("choice", "choice", ["yes", "no", "maybe so"], "maybe so", "nope"),
    ("Lark grammar", "lark", LARK_ARITH, "(1+2)-30", "1+-2"),
    ("GBNF/EBNF grammar", "gbnf", GBNF_ARITH, "(1+2)-30", "1+-2"),
]
