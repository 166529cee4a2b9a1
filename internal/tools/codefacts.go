package tools

import (
	"context"
	"encoding/json"

	"github.com/pysandbox/pysandbox/internal/codefacts"
)

// codeFacts derives the facts of code that the policy's code rules look
// at, with Python's own parser inside a sandbox (internal/codefacts).
func (s *server) codeFacts(ctx context.Context, code, python string) (map[string]any, string, error) {
	f, err := codefacts.Derive(ctx, s.eng, code, python)
	if err != nil {
		return nil, "", err
	}
	return f.Value(), f.Summary(), nil
}

// runFacts reads the facts a run's worker sent of its own code.
func runFacts(raw json.RawMessage, code string) (map[string]any, string, error) {
	var line string
	if err := json.Unmarshal(raw, &line); err == nil {
		raw = json.RawMessage(line)
	}
	f, err := codefacts.FromLine(string(raw), code)
	if err != nil {
		return nil, "", err
	}
	return f.Value(), f.Summary(), nil
}
