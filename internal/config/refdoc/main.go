// Command refdoc writes docs/configuration-reference.md: every setting of
// patchbay, from the environment and the config file, read from the source
// of package config (go/parser), so the reference cannot drift from the
// typed config. `make generate` runs it; a test in this package fails while
// the committed file differs from what it writes.
//
// It reads two roots. Config's fields are the environment settings, each
// comment in one of two forms (see parseEnvComment):
//
//	Name (ENV, default VALUE) does what it does.
//	ENV, default VALUE: what it does
//
// A setting whose comment breaks them stops the generator: the comment is
// fixed, not the setting left out. File is the config file: its keys are
// the yaml tags, followed through nested structs, lists and maps, with
// each field's comment as its description and the default it states.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
)

// The roots of the two parts, in package config.
const (
	envRoot  = "Config"
	fileRoot = "File"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run parses the flags, generates the reference and writes it to -o (or
// stdout).
func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("refdoc", flag.ContinueOnError)
	dir := fs.String("dir", ".", "the directory of package config")
	out := fs.String("o", "", "the file to write; stdout when empty")
	if err := fs.Parse(args); err != nil {
		return err
	}
	doc, err := generate(*dir)
	if err != nil {
		return err
	}
	if *out == "" {
		_, err = stdout.Write(doc)
		return err
	}
	if err := os.WriteFile(*out, doc, 0o644); err != nil {
		return fmt.Errorf("refdoc: %w", err)
	}
	return nil
}

// generate is the reference for the config package in dir.
func generate(dir string) ([]byte, error) {
	p, err := loadPkg(dir)
	if err != nil {
		return nil, err
	}
	env, err := p.envRows(envRoot, fileRoot)
	if err != nil {
		return nil, err
	}
	file, err := p.fileSections(fileRoot)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := (&reference{env: env, file: file}).write(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
