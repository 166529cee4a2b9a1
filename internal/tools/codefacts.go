package tools

import (
	"context"

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
