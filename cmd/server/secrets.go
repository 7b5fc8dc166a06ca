package main

import (
	"fmt"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// secretStores builds the chain {"$secret": name} resolves through: Redis
// (values PUT through the API, encrypted under PATCHBAY_SECRET_KEY) first,
// so a value set there takes effect, then files in PATCHBAY_SECRETS_DIR,
// then PATCHBAY_SECRET_<NAME> variables. The writer is nil without a key.
func secretStores(cfg *config.Config, st *store.Store, getenv func(string) string) (secrets.SecretStore, secrets.SecretWriter, error) {
	var stores []secrets.SecretStore
	var writer secrets.SecretWriter
	if cfg.SecretKey != "" {
		keys, err := secrets.ParseKeyring(cfg.SecretKey)
		if err != nil {
			return nil, nil, &config.ValidationError{Problems: []config.Problem{{Path: "PATCHBAY_SECRET_KEY", Message: err.Error()}}}
		}
		rs := secrets.NewRedisSecrets(st, keys)
		stores, writer = append(stores, rs), rs
	}
	if cfg.SecretsDir != "" {
		fs, err := secrets.NewFileSecrets(cfg.SecretsDir)
		if err != nil {
			return nil, nil, fmt.Errorf("PATCHBAY_SECRETS_DIR: %w", err)
		}
		stores = append(stores, fs)
	}
	stores = append(stores, secrets.NewEnvSecrets(getenv))
	return secrets.ChainSecrets(stores...), writer, nil
}
