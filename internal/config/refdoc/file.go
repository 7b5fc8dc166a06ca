package main

import (
	"fmt"
	"regexp"
	"strings"
)

// fileRow is one key of the config file.
type fileRow struct {
	key, typ, def, desc string
}

// section is one table of the config file's part: a top-level key, or one
// field of a top-level entry that is split by its fields (connections by
// kind).
type section struct {
	title string // the key path it covers
	words bool   // the title is words, not a key path
	level int    // 0: a top-level key; 1: a part of one
	intro string // the doc comment of its type
	rows  []fileRow
}

// splitAt is how many mapping-valued fields make a top-level entry's
// table split into one per field: a connection is one of several kinds,
// each with keys of its own, while an agent with one nested mapping reads
// best in one table.
const splitAt = 2

// fileSections lists the config file's keys: the top level first, then a
// section for each top-level key that holds mappings, in source order.
func (p *pkg) fileSections(root string) ([]section, error) {
	d, _, err := p.structType(root)
	if err != nil {
		return nil, err
	}
	top, err := p.rowsOf(root, "", nil, false)
	if err != nil {
		return nil, err
	}
	out := []section{{title: "Top level", words: true, intro: d.doc, rows: top}}
	fs, err := p.visibleFields(root)
	if err != nil {
		return nil, err
	}
	for _, f := range fs {
		sh, err := p.resolve(f.typ)
		if err != nil {
			return nil, err
		}
		in := sh.inner()
		if in == nil {
			continue
		}
		more, err := p.keySections(f.key, f.key+sh.suffix(), in.name)
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
	}
	return out, nil
}

// keySections is the section of one top-level key whose entries are the
// struct typeName, split by kind when it has splitAt or more mapping
// fields.
func (p *pkg) keySections(title, prefix, typeName string) ([]section, error) {
	d, _, err := p.structType(typeName)
	if err != nil {
		return nil, err
	}
	fs, err := p.visibleFields(typeName)
	if err != nil {
		return nil, err
	}
	var kinds []field
	for _, f := range fs {
		if sh, err := p.resolve(f.typ); err == nil && sh.inner() != nil {
			kinds = append(kinds, f)
		}
	}
	split := len(kinds) >= splitAt
	rows, err := p.rowsOf(typeName, prefix, nil, !split)
	if err != nil {
		return nil, err
	}
	out := []section{{title: title, intro: d.doc, rows: rows}}
	if !split {
		return out, nil
	}
	for _, f := range kinds {
		sh, _ := p.resolve(f.typ)
		in := sh.inner()
		sd, _, err := p.structType(in.name)
		if err != nil {
			return nil, err
		}
		path := prefix + "." + f.key
		rows, err := p.rowsOf(in.name, path+sh.suffix(), nil, true)
		if err != nil {
			return nil, err
		}
		out = append(out, section{title: path, level: 1, intro: sd.doc, rows: rows})
	}
	return out, nil
}

// visibleFields are a struct's fields as the file has them: those left out
// of YAML dropped, inlined ones replaced by their own.
func (p *pkg) visibleFields(typeName string) ([]field, error) {
	_, st, err := p.structType(typeName)
	if err != nil {
		return nil, err
	}
	fs, err := p.fields(st)
	if err != nil {
		return nil, err
	}
	var out []field
	for _, f := range fs {
		switch {
		case f.skip:
		case f.inline:
			sh, err := p.resolve(f.typ)
			if err != nil || sh.kind != structKind {
				return nil, fmt.Errorf("refdoc: %s.%s: only a struct can be inlined", typeName, f.name)
			}
			more, err := p.visibleFields(sh.name)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		default:
			out = append(out, f)
		}
	}
	return out, nil
}

// rowsOf lists the keys of struct typeName under prefix, each followed by
// the keys below it when deep is set. seen holds the types on the way
// down, so that a type holding itself ends the walk instead of looping.
func (p *pkg) rowsOf(typeName, prefix string, seen []string, deep bool) ([]fileRow, error) {
	for _, s := range seen {
		if s == typeName {
			return nil, nil
		}
	}
	seen = append(seen, typeName)
	fs, err := p.visibleFields(typeName)
	if err != nil {
		return nil, err
	}
	var rows []fileRow
	for i, f := range fs {
		sh, err := p.resolve(f.typ)
		if err != nil {
			return nil, err
		}
		key := f.key
		if prefix != "" {
			key = prefix + "." + f.key
		}
		def, desc := describe(fs, i)
		rows = append(rows, fileRow{key: key, typ: sh.fileType(), def: def, desc: desc})
		if in := sh.inner(); in != nil && deep {
			more, err := p.rowsOf(in.name, key+sh.suffix(), seen, true)
			if err != nil {
				return nil, err
			}
			rows = append(rows, more...)
		}
	}
	return rows, nil
}

// describe is field i's default and description. A field without a
// comment of its own, written right below one whose comment names it
// ("TimeoutMs …, default 30000; RequestTimeoutMs …, default 60000"),
// shares that comment: its default is taken from the clauses naming it.
func describe(fs []field, i int) (def, desc string) {
	f := fs[i]
	if own := oneLine(f.doc + " " + f.line); own != "" {
		if sharesComment(fs, i) {
			return findDefault(clausesNaming(own, f.name)), leadingKeys(own, fs)
		}
		return findDefault(own), leadingKeys(own, fs)
	}
	for j := i - 1; j >= 0 && fs[j].last+1 >= fs[j+1].first; j-- {
		if fs[j].doc == "" {
			continue
		}
		text := oneLine(fs[j].doc)
		if !mentions(text, f.name) {
			return "", ""
		}
		return findDefault(clausesNaming(text, f.name)), "See `" + fs[j].key + "`."
	}
	return "", ""
}

// sharesComment reports whether field i's comment also documents the
// uncommented field right below it, by naming it.
func sharesComment(fs []field, i int) bool {
	if i+1 >= len(fs) {
		return false
	}
	next := fs[i+1]
	return next.doc == "" && next.line == "" && fs[i].last+1 >= next.first && mentions(fs[i].doc, next.name)
}

// leadingKeys replaces the Go names a doc comment starts with ("Command,
// Args, Env and Cwd start …") by the keys the file uses. Only that
// subject is rewritten: further on, a name such as OAuth or URL is as
// likely a word of the prose as a field.
func leadingKeys(text string, fs []field) string {
	var b strings.Builder
	rest := text
	for {
		f, ok := leadingField(rest, fs)
		if !ok {
			break
		}
		b.WriteString("`" + f.key + "`")
		rest = rest[len(f.name):]
		sep := ""
		for _, s := range []string{", and ", ", ", " and "} {
			if strings.HasPrefix(rest, s) {
				sep = s
				break
			}
		}
		if _, next := leadingField(rest[len(sep):], fs); sep == "" || !next {
			break
		}
		b.WriteString(sep)
		rest = rest[len(sep):]
	}
	return b.String() + rest
}

// leadingField is the field whose Go name text starts with, as a whole
// word.
func leadingField(text string, fs []field) (field, bool) {
	var best field
	for _, f := range fs {
		rest, ok := strings.CutPrefix(text, f.name)
		if ok && (rest == "" || !isIdentRune(rest[0])) && len(f.name) > len(best.name) {
			best = f
		}
	}
	return best, best.name != ""
}

func isIdentRune(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// mentions reports whether text names the Go identifier name.
func mentions(text, name string) bool { return wordRE(name).MatchString(text) }

func wordRE(name string) *regexp.Regexp {
	return regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`)
}

// clausesNaming keeps what the clauses of text (split at "; " and ". ")
// say from where they name the field on: in "A bounds x (default 1) and
// B y (default 2)" only "B y (default 2)" is about B.
func clausesNaming(text, name string) string {
	re := wordRE(name)
	var keep []string
	for _, sentence := range strings.Split(text, ". ") {
		for _, clause := range strings.Split(sentence, "; ") {
			if loc := re.FindStringIndex(clause); loc != nil {
				keep = append(keep, clause[loc[0]:])
			}
		}
	}
	return strings.Join(keep, "; ")
}

var (
	defaultRE = regexp.MustCompile(`(?i)\bdefault\b`)
	// valueEndRE ends a default: a clause's punctuation or a parenthesis.
	valueEndRE = regexp.MustCompile(`[,;:]\s|\s\(|\)|\.\s|\.$`)
	// articleRE finds "the default", "a property's default" and the like
	// in prose: a noun there, not followed by a value.
	articleRE = regexp.MustCompile(`(?i)(?:\b(?:the|a|its|no)|'s)\s$`)
)

// findDefault is the default a comment states, "" when it states none.
// The comments of the config file's fields say it in prose, in one of two
// ways: "default 30000" or "unsafe (default)".
func findDefault(text string) string {
	for _, m := range defaultRE.FindAllStringIndex(text, -1) {
		before, after := text[:m[0]], text[m[1]:]
		if v, ok := valueBefore(before, after); ok {
			return v
		}
		if v, ok := valueAfter(text[m[0]:m[1]], before, after); ok {
			return v
		}
	}
	return ""
}

// valueBefore reads "unsafe (default)", "all (default, …)" and
// "same-origin (the default: …)".
func valueBefore(before, after string) (string, bool) {
	b, ok := strings.CutSuffix(strings.TrimSuffix(before, "the "), " (")
	if !ok || after == "" || !strings.ContainsRune("),:", rune(after[0])) {
		return "", false
	}
	words := strings.Fields(b)
	if len(words) == 0 {
		return "", false
	}
	return strings.Trim(words[len(words)-1], ".,;:"), true
}

// valueAfter reads "default 30000" and "Default 168h (senders …)". A
// capitalized Default inside a sentence is a field's name ("unless Default
// is set"), not a default.
func valueAfter(word, before, after string) (string, bool) {
	start := before == "" || strings.HasSuffix(before, ". ")
	if articleRE.MatchString(before) || word != "default" && !start {
		return "", false
	}
	v, ok := strings.CutPrefix(after, " ")
	if !ok || v == "" || strings.ContainsRune(",;:().", rune(v[0])) {
		return "", false
	}
	if loc := valueEndRE.FindStringIndex(v); loc != nil {
		v = v[:loc[0]]
	}
	v = strings.TrimSpace(v)
	return v, v != ""
}
