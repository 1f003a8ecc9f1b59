// JSON Schema -> GBNF, for OpenAI's response_format json_schema and llama-server's json_schema:
// the grammar accepts JSON texts the schema accepts (a subset of them where the schema leaves a
// choice: properties come in the schema's order (an ordered_json keeps it), no keys beyond those named unless
// additionalProperties asks for them, whitespace bounded as llama.cpp bounds it).
//
// Supported: type (one or a list) object/array/string/number/integer/boolean/null, properties,
// required, additionalProperties (bool or schema), items, prefixItems, minItems/maxItems,
// enum, const, anyOf/oneOf (oneOf as anyOf), allOf of one schema, $ref to "#", "#/$defs/..." and
// "#/definitions/...", minLength/maxLength, format date/time/date-time/uuid, nullable (OpenAPI),
// pattern (anchored; regex.h).
// Annotations (title, description, default, examples, $schema, ...) are ignored. Any other
// keyword that constrains (minimum, maximum, multipleOf, not, if, uniqueItems, ...)
// is refused by name rather than silently not enforced.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvs::grammar {

// The GBNF of `schema` (rule root); throws kvs::Error naming what is refused and where.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// Any JSON object (response_format json_object).
std::string json_object_gbnf();

}  // namespace kvs::grammar
