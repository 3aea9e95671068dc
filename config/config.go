// Package config loads the plugin configuration from flags, environment
// variables and an optional YAML file, in that order of precedence, fills
// in defaults and parses everything into typed, normalised values, so that
// the rest of the program never parses a setting again. It is a leaf: it
// imports no package of this project. Checks that need the runtime
// packages (exec templates, socket paths, device names) are made by their
// constructors; cmd turns their errors into FieldErrors.
package config

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every validation error, so callers can tell bad
// input (exit status 2) from runtime failures with errors.Is.
var ErrInvalid = errors.New("invalid configuration")

// ErrVersion is returned by Load for --version, as flag.ErrHelp is for -h.
var ErrVersion = errors.New("version requested")

// FieldError names the offending field and value.
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid configuration: %s=%q: %s", e.Field, e.Value, e.Reason)
}

// Unwrap lets errors.Is(err, ErrInvalid) match.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, value, format string, args ...any) error {
	return &FieldError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
}
