package main

import (
	"log/slog"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
)

// providerKind is a connection kind implemented in Go inside patchbay (a
// provider, such as drive): how an entry of the kind becomes its
// connect.Provider, and what the kind takes.
type providerKind struct {
	// gitHubApp declares that the kind's code asks a GitHub App for
	// installation tokens itself, at each call, naming the repository and
	// permissions that call needs: an entry's
	// auth: {githubApp: {appId, privateKey, apiBaseUrl?}} then hands it
	// the App's source (providerDeps.tokens), the one every connection of
	// that App shares. An entry of a kind without it is refused. (The
	// kind's config validation lets auth.githubApp through; gitHubApps
	// checks it with config.GitHubApp.CheckSource.)
	gitHubApp bool
	build     func(name string, spec config.Connection, d providerDeps) connect.Provider
}

// providerDeps are what the server hands a provider kind's constructor.
type providerDeps struct {
	logger   *slog.Logger
	secrets  secrets.SecretStore
	redactor *secrets.SecretRedactor
	// tokens is the entry's GitHub App source, nil without one. A kind
	// passes it on as an interface of its own with the methods it calls
	// (Token, Invalidate, APIBaseURL).
	tokens *lazySource
}

// providerKinds are the provider kinds, by config kind. Google's Drive
// takes no GitHub tokens.
var providerKinds = map[string]providerKind{
	config.KindDrive: {build: func(name string, spec config.Connection, d providerDeps) connect.Provider {
		return drive.New(name, *spec.Drive, &drive.Options{
			Logger: d.logger, ServiceAccount: serviceAccount(spec), Secrets: d.secrets, Redactor: d.redactor,
		})
	}},
}

// newProvider builds the provider of the entry name, of kind k.
func newProvider(name string, spec config.Connection, k providerKind, d providerDeps) (connect.Provider, error) {
	if d.tokens != nil && !k.gitHubApp {
		return nil, &config.ValidationError{Problems: []config.Problem{{Path: "connections." + name + ".auth.githubApp",
			Message: "is not supported on a " + spec.Kind() + " connection: its code takes no GitHub tokens"}}}
	}
	return k.build(name, spec, d), nil
}
