// Package docs holds the checks of the project's documentation: the
// README's and the guides' links and anchors resolve, their pictures come
// from tests, and every example they show runs. It has no code of its
// own; its tests read the files.
//
// # Examples are tests
//
// Every fenced block of README.md and docs/*.md (but the generated
// configuration reference) has a marker, an HTML comment on the line right
// before its opening fence:
//
//	<!-- example: examples/quickstart/run.sh -->
//	<!-- answer: examples/quickstart/run.out -->
//	<!-- illustration -->
//
// An example block is the file it names under examples/, byte for byte,
// so what a reader copies is what is tested. An answer block is the golden
// of the script beside it, byte for byte. An illustration (a fragment of a
// larger file, a diagram, a client's code, commands that start things) is
// left alone; a sh block with curl in it may not be one.
//
// Every file under examples/ has a use, or the test fails:
//
//   - a script (.sh) runs with bash from the repository's root against a
//     real bin/server (built by the test, one process per config, on a
//     free loopback port), its "localhost:8080" made that server's
//     address, and what it prints is compared with its golden (.out); its
//     header lines "# config: a.yaml b.yaml" (merged in order; default
//     examples/patchbay.yaml) and "# needs: redis" (the Redis at
//     PATCHBAY_TEST_REDIS_URL) say what it runs against. A script that
//     needs anything else (a coding agent, a real API) is checked (bash -n,
//     its config, its JSON bodies) instead of run;
//   - a config file (.yaml) is loaded with config.Load, stand-in values
//     given to the ${env:NAME} it names, on top of the file a first line
//     "# with: examples/….yaml" names; a profile or binding file is loaded
//     with the profiles loader;
//   - a JSON file is sent by a script that names it, or is a workflow
//     document a guide only shows, parsed by the engine against stand-ins
//     of its config's connections (sentNotRun), or is read by the config
//     loader (a trigger's workflow).
//
// Loopback servers the configs name are fakes the test starts: the demo
// MCP server over HTTP, Prism mocking the Petstore, a scripted
// OpenAI-compatible model. Goldens are compared after normalize (ids,
// times, durations, event ids, ports); JSON as JSON, where "..." in the
// golden elides members or elements, other output line by line, where a
// line "..." elides lines. -update (or UPDATE_GOLDEN=1) rewrites a golden
// that no longer matches, and the answer blocks tied to it.
package docs
