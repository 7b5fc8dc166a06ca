package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// numbersProblem refuses a body holding a number no float64 can hold
// (1e400): decoded as usual it would be stored as null. 400, as malformed
// JSON is, naming each such field.
func numbersProblem(body []byte) error {
	paths := fault.NumbersOutOfRange(body, "")
	if len(paths) == 0 {
		return nil
	}
	errs := make([]fault.FieldError, len(paths))
	for i, p := range paths {
		errs[i] = fault.FieldError{Path: p, Code: fault.CodeNumberOutOfRange, Message: "is a number too large to represent (beyond ±1.8e308)"}
	}
	return problem(http.StatusBadRequest, string(fault.CodeNumberOutOfRange),
		paths[0]+": is a number too large to represent", errs...)
}

// decodeClosed decodes a JSON object into dst, a pointer to a struct, the
// way the contract closes it (additionalProperties: false): a member the
// struct does not name is a 422 naming it, as is a member of the wrong
// type; a body that is not a JSON object is a 400.
func decodeClosed(body []byte, dst any) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return malformed(err)
	}
	if err := numbersProblem(body); err != nil {
		return err
	}
	if problems := unknownMembers(fields, jsonNames(dst)...); len(problems) > 0 {
		return problem(http.StatusUnprocessableEntity, codeValidationFailed, "the request has invalid fields", problems...)
	}
	if err := json.Unmarshal(body, dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			path := "/" + strings.ReplaceAll(te.Field, ".", "/")
			return fieldProblem(fault.CodeValidationFailed, path, "must be "+jsonKind(te.Type))
		}
		return malformed(err)
	}
	return nil
}

// unknownMembers names each member of a closed object that allowed does
// not list.
func unknownMembers(fields map[string]json.RawMessage, allowed ...string) []fault.FieldError {
	var problems []fault.FieldError
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(allowed, k) {
			problems = append(problems, fault.FieldError{Path: "/" + k, Code: fault.CodeValidationFailed,
				Message: fmt.Sprintf("unknown field %q (allowed: %s)", k, strings.Join(allowed, ", "))})
		}
	}
	return problems
}

// jsonNames lists the JSON member names of the struct dst points to.
func jsonNames(dst any) []string {
	t := reflect.TypeOf(dst).Elem()
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// jsonKind names a Go type as JSON would, for messages.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(jsonKind(t.Elem()), "a "), "an ") + "s"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Float64, reflect.Float32:
		return "a number"
	}
	return "a different type"
}
