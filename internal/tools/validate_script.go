package tools

import (
	"context"
	"errors"
	"fmt"
	"github.com/pysandbox/pysandbox/internal/govern"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"

	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// ValidateScriptInput is validate_script's input.
type ValidateScriptInput struct {
	Code         string   `json:"code" jsonschema:"Python 3 source code to check. It is compiled inside the sandbox, never run."`
	Dependencies []string `json:"dependencies,omitempty" jsonschema:"PEP 508 requirement strings to check, merged with those of an inline '# /// script' block."`
}

// Dependency is one requirement and whether it is valid PEP 508.
type Dependency struct {
	Requirement string `json:"requirement"`
	Valid       bool   `json:"valid"`
	Name        string `json:"name,omitempty"` // normalised project name
	Error       string `json:"error,omitempty"`
}

// ValidateScriptOutput is validate_script's result.
type ValidateScriptOutput struct {
	Outcome
	// Valid is true when the code compiles and every problem below is absent.
	Valid       bool                `json:"valid"`
	SyntaxError *worker.SyntaxError `json:"syntax_error"`
	// ScriptBlock is true when the code has a PEP 723 "# /// script" block.
	ScriptBlock    bool   `json:"script_block"`
	RequiresPython string `json:"requires_python"`
	// Python is the interpreter a run would get for requires_python:
	// the host's, a managed one, or one downloaded on first use.
	Python       string       `json:"python,omitempty" jsonschema:"for a requires-python: the interpreter run_python would use, and whether it would first be downloaded"`
	Dependencies []Dependency `json:"dependencies"`
	Problems     []string     `json:"problems"`
	// Network lists the hosts the code names in http(s) URLs, and whether
	// the network policy lets a run reach them.
	Network []NetworkTarget `json:"network,omitempty"`
}

const validateScriptDescription = `Check Python code without running it: it is compiled inside the sandbox, and any syntax error is reported with its line, column and message. An inline PEP 723 metadata block ("# /// script" ... "# ///") is parsed: its requires-python is checked against the interpreters the server has or can download (python names the one a run would use, and whether it is downloaded on first use), and its dependencies, merged with the dependencies argument, are each checked against PEP 508 syntax. valid is true only when there are no problems.`

func (s *server) addValidateScript(srv *mcp.Server) {
	addTool(s, srv, &mcp.Tool{
		Name:        "validate_script",
		Title:       "Validate a Python script",
		Description: validateScriptDescription,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.validateScript)
}

func (s *server) validateScript(ctx context.Context, req *mcp.CallToolRequest, in ValidateScriptInput) (*mcp.CallToolResult, *ValidateScriptOutput, error) {
	if msg := checkCode(in.Code); msg != "" {
		return nil, nil, errorResult(msg)
	}
	if err := engine.CheckDependencies(in.Dependencies); err != nil {
		return nil, nil, errorResult(err.Error() + ".")
	}
	out := &ValidateScriptOutput{Dependencies: []Dependency{}, Problems: []string{}}

	// The block as a checker sees it: all that is valid in it, and every
	// problem (a run refuses it on the first).
	meta, blockProblems := pep.InspectScriptMetadata(in.Code)
	var fromBlock []string
	if meta != nil {
		out.ScriptBlock = true
		out.RequiresPython = meta.RequiresPython
		fromBlock = meta.Entries
	}
	for _, err := range blockProblems {
		if de, ok := errors.AsType[*pep.DependencyError](err); ok && de.Requirement != "" {
			// With its line: the entry is listed with the others below.
			out.Problems = append(out.Problems, fmt.Sprintf("inline script metadata: line %d: dependency %q: %v", de.Line, de.Requirement, de.Err))
			continue
		}
		out.Problems = append(out.Problems, "inline script metadata: "+strings.TrimPrefix(err.Error(), "pep723: "))
	}
	// Every entry is reported, invalid ones included, in order; exact
	// duplicates (the same requirement spelled alike) are listed once.
	seen := map[string]bool{}
	for i, r := range append(append([]string(nil), fromBlock...), in.Dependencies...) {
		req, err := pep.ParseRequirement(r)
		if err != nil {
			out.Dependencies = append(out.Dependencies, Dependency{Requirement: r, Error: err.Error()})
			if i >= len(fromBlock) { // the block's are in Problems already
				out.Problems = append(out.Problems, fmt.Sprintf("dependency %q: %v", r, err))
			}
			continue
		}
		if seen[req.String()] {
			continue
		}
		seen[req.String()] = true
		dep := Dependency{Requirement: strings.TrimSpace(r), Valid: true, Name: req.Normalized}
		// Say now what run_python would refuse.
		if err := s.gov.Policy().Packages.Check(req.Normalized); err != nil {
			dep.Error = err.Error()
			out.Problems = append(out.Problems, fmt.Sprintf("dependency %q: %v", r, err))
		}
		out.Dependencies = append(out.Dependencies, dep)
	}
	if out.RequiresPython != "" {
		// What run_python would do: the server's Python, another the
		// host has, or one it downloads.
		py, err := s.eng.WhichPython("", out.RequiresPython)
		if err != nil {
			out.Problems = append(out.Problems, fmt.Sprintf("requires-python %q: %v", out.RequiresPython, err))
		}
		out.Python = py
	}

	var netProblems []string
	out.Network, netProblems = s.networkTargets(in.Code)
	out.Problems = append(out.Problems, netProblems...)

	release, refused := s.takeQuota(ctx, req)
	if refused != nil {
		return nil, nil, refused
	}
	defer release()
	v, err := s.eng.Validate(ctx, in.Code, "")
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.Canceled) {
			return nil, nil, refusal(govern.StatusCancelled, "The call was cancelled.")
		}
		if errors.Is(err, engine.ErrBusy) {
			return nil, nil, busyResult(err)
		}
		return nil, nil, refusal(govern.StatusSandboxError, fmt.Sprintf("The sandbox could not compile the code: %v. Run check_environment to see whether the sandbox works on this server.", err))
	}
	if !v.Valid {
		out.SyntaxError = v.SyntaxError
		if se := v.SyntaxError; se != nil {
			out.Problems = append(out.Problems, fmt.Sprintf("syntax error at line %d, column %d: %s", se.Line, se.Column, se.Message))
		} else {
			out.Problems = append(out.Problems, "the code does not compile")
		}
	}
	out.Valid = len(out.Problems) == 0
	text := "valid"
	if out.Valid && out.Python != "" {
		// A download can still fail (no network): worth knowing now.
		text += "; requires-python " + out.RequiresPython + " runs on Python " + out.Python
	}
	if !out.Valid {
		text = "invalid:"
		for _, p := range out.Problems {
			text += "\n- " + p
		}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, out, nil
}
