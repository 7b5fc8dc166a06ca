package main

import (
	"errors"
	"fmt"
	"go/ast"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// envRE finds the environment variable a setting's comment names.
var envRE = regexp.MustCompile(`\b(?:PATCHBAY_[A-Z0-9_]+|REDIS_URL)\b`)

// envRow is one environment setting.
type envRow struct {
	env, field, typ, def, desc string
}

// The convention errors: a setting whose comment breaks it fails the
// generator, so the comment is fixed rather than the setting left out.
var (
	errNoEnv     = errors.New("its comment names no environment variable (PATCHBAY_… or REDIS_URL)")
	errNoDefault = errors.New(`its comment does not say "NAME, default VALUE" right after the variable`)
	errNoDesc    = errors.New("its comment says nothing beside the variable and default")
)

// envRows lists the environment settings: one per field of root, in
// source order. A struct field that names no variable (Limits) stands for
// its own fields; the field of type skip (the config file) is not from the
// environment.
func (p *pkg) envRows(root, skip string) ([]envRow, error) {
	rows, err := p.envFields(root, "", skip)
	if err != nil {
		return nil, err
	}
	seen := map[string]string{}
	for _, r := range rows {
		if first, dup := seen[r.env]; dup {
			return nil, fmt.Errorf("refdoc: %s and %s both name %s", first, r.field, r.env)
		}
		seen[r.env] = r.field
	}
	return rows, nil
}

func (p *pkg) envFields(typeName, prefix, skip string) ([]envRow, error) {
	_, st, err := p.structType(typeName)
	if err != nil {
		return nil, err
	}
	fs, err := p.fields(st)
	if err != nil {
		return nil, err
	}
	var rows []envRow
	for _, f := range fs {
		if id, ok := f.typ.(*ast.Ident); ok && id.Name == skip {
			continue
		}
		text := oneLine(f.doc + " " + f.line)
		env, def, desc, err := parseEnvComment(text)
		if errors.Is(err, errNoEnv) {
			if sub, ok := p.nestedStruct(f.typ); ok {
				more, err := p.envFields(sub, prefix+f.name+".", skip)
				if err != nil {
					return nil, err
				}
				rows = append(rows, more...)
				continue
			}
		}
		if err != nil {
			return nil, fmt.Errorf("refdoc: %s.%s%s: %w", typeName, prefix, f.name, err)
		}
		sh, err := p.resolve(f.typ)
		if err != nil {
			return nil, err
		}
		rows = append(rows, envRow{env: env, field: prefix + f.name, typ: sh.envType(), def: def, desc: desc})
	}
	return rows, nil
}

// nestedStruct reports whether t is a struct type of the package (not a
// pointer or container of one).
func (p *pkg) nestedStruct(t ast.Expr) (string, bool) {
	id, ok := t.(*ast.Ident)
	if !ok {
		return "", false
	}
	d, ok := p.types[id.Name]
	if !ok {
		return "", false
	}
	_, isStruct := d.spec.Type.(*ast.StructType)
	return id.Name, isStruct
}

// parseEnvComment reads a setting's comment in one of the two forms the
// config package writes:
//
//	Name (ENV, default VALUE) does what it does.   (doc comment)
//	ENV, default VALUE: what it does               (line comment)
//
// It returns the variable, the default and the description, which is the
// comment without the variable and default.
func parseEnvComment(text string) (env, def, desc string, err error) {
	loc := envRE.FindStringIndex(text)
	if loc == nil {
		return "", "", "", errNoEnv
	}
	env, rest := text[loc[0]:loc[1]], text[loc[1]:]
	value, ok := strings.CutPrefix(rest, ", default ")
	if !ok {
		return env, "", "", errNoDefault
	}
	switch {
	case loc[0] > 0 && text[loc[0]-1] == '(':
		end := closingParen(value)
		if end < 0 {
			return env, "", "", errNoDefault
		}
		def = value[:end]
		desc = strings.TrimRight(text[:loc[0]-1], " ") + value[end+1:]
	case loc[0] == 0:
		def, desc, ok = strings.Cut(value, ": ")
		if !ok {
			return env, "", "", errNoDesc
		}
	default:
		return env, "", "", errNoDefault
	}
	def, desc = strings.TrimSpace(def), strings.TrimSpace(desc)
	switch {
	case def == "":
		return env, "", "", errNoDefault
	case desc == "":
		return env, "", "", errNoDesc
	}
	return env, def, capitalize(desc), nil
}

// closingParen is the index of the ')' that closes the parenthesis s is
// inside, -1 when there is none.
func closingParen(s string) int {
	depth := 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				return i
			}
			depth--
		}
	}
	return -1
}

// capitalize starts a line comment's description as a sentence, like the
// doc comments' beside it.
func capitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[n:]
}
