package pep

import (
	"errors"
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// Limits on PEP 723 metadata. The code itself is bounded by the caller; these
// bound what the metadata can make us do with it.
const (
	// MaxScriptMetadataSize bounds the TOML content of a script block, in
	// bytes.
	MaxScriptMetadataSize = 64 << 10
	// MaxDependencies bounds the number of entries in "dependencies".
	MaxDependencies = 256

	// The TOML parser's cost grows with the square of a key's length and
	// of the nesting depth, so 64 KiB of "a.a.a.…" or "{a={a={…" takes
	// tens of seconds. These bounds, far above anything real metadata
	// needs, keep it linear; see checkTOMLShape.
	maxTOMLDepth   = 32
	maxTOMLLineDot = 64
)

// ScriptMetadata is the content of a PEP 723 "script" metadata block.
type ScriptMetadata struct {
	RequiresPython string   // "" when absent
	Dependencies   []string // as written; each is a valid PEP 508 requirement
	// Entries are the block's string entries as written, in order, the
	// invalid ones too (InspectScriptMetadata's problems say why each is),
	// so that a report can list every one where it stands.
	Entries []string
	// StartLine and EndLine are the 1-based lines of the "# /// script" and
	// closing "# ///" lines in the source.
	StartLine, EndLine int
}

// ParseScriptMetadata finds and parses the PEP 723 "script" block in Python
// source code, such as
//
//	# /// script
//	# requires-python = ">=3.11"
//	# dependencies = ["requests<3", "rich"]
//	# ///
//
// It returns nil, nil when there is no such block. Blocks of other types are
// ignored, as are unknown keys (such as [tool.*] tables) inside the block.
// As PEP 723 requires, each dependency must be a valid PEP 508 requirement
// and requires-python a valid version specifier set; anything else is an
// error, as is a second script block.
//
// Blocks are found exactly as the reference regular expression in PEP 723
// finds them,
//
//	(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$
//
// so a block runs from its opening line to the last "# ///" line in the
// unbroken run of comment lines that follows it, and a block with no content
// lines is not a block at all. Line endings are first normalised the way
// Python reads source ("\r\n" and "\r" become "\n") and a leading byte-order
// mark is dropped, so that what the agent sees as a block is one.
func ParseScriptMetadata(code string) (*ScriptMetadata, error) {
	md, problems := InspectScriptMetadata(code)
	if len(problems) > 0 {
		return nil, problems[0]
	}
	return md, nil
}

// DependencyError is an entry of "dependencies" that is not a valid
// requirement.
type DependencyError struct {
	Line        int    // the source line it is written on, as near as can be told
	Index       int    // its place in the list, from 0
	Requirement string // as written; "" when the entry is not a string
	Err         error
	notString   bool
}

func (e *DependencyError) Error() string {
	if e.notString {
		return fmt.Sprintf("pep723: line %d: dependencies[%d] %v", e.Line, e.Index, e.Err)
	}
	return fmt.Sprintf("pep723: line %d: dependencies[%d]: %v", e.Line, e.Index, e.Err)
}

func (e *DependencyError) Unwrap() error { return e.Err }

// InspectScriptMetadata is ParseScriptMetadata for a checker, which wants
// every problem and all that is valid beside them rather than a verdict:
// it returns the block whenever there is one (with the line numbers only,
// when its TOML does not parse; with the valid dependencies and a valid
// requires-python otherwise), and each problem, entries of
// "dependencies" as *DependencyError, in order. A run refuses the block
// on the first of them (ParseScriptMetadata).
func InspectScriptMetadata(code string) (*ScriptMetadata, []error) {
	code = normalizeNewlines(strings.TrimPrefix(code, "\ufeff"))

	var found []block
	for b := range findBlocks(code) {
		if b.typ == "script" {
			if found = append(found, b); len(found) == 2 {
				break // enough to report the duplicate
			}
		}
	}
	if len(found) == 0 {
		return nil, nil
	}
	b := found[0]
	if len(found) > 1 {
		// Which block a run would use is undefined: no content is reported.
		return &ScriptMetadata{StartLine: b.start, EndLine: b.end},
			[]error{fmt.Errorf("pep723: more than one script metadata block (lines %d and %d)", found[0].start, found[1].start)}
	}
	if len(b.content) > MaxScriptMetadataSize {
		return &ScriptMetadata{StartLine: b.start, EndLine: b.end},
			[]error{fmt.Errorf("pep723: line %d: script metadata block too large (%d bytes, limit %d)", b.start, len(b.content), MaxScriptMetadataSize)}
	}
	md, problems := decodeMetadata(stripCommentPrefixes(b.content), b)
	md.StartLine, md.EndLine = b.start, b.end
	return md, problems
}

// block is one match of the PEP 723 regular expression.
type block struct {
	typ        string
	content    string // the comment lines between the delimiters, each with its '\n'
	start, end int    // 1-based lines of the opening and closing delimiters
}

// findBlocks yields the PEP 723 blocks of code in order, as re.finditer
// would with the reference expression. It works line by line and touches
// each line at most twice, so that no input, however many unclosed openings
// it holds, costs more than linear time (the regular expression itself would
// backtrack quadratically).
func findBlocks(code string) func(yield func(block) bool) {
	return func(yield func(block) bool) {
		off, line := 0, 1
		for off < len(code) {
			text, nl, next := lineAt(code, off)
			typ, ok := openingType(text)
			if !ok || !nl {
				off, line = next, line+1
				continue
			}
			// The content is the longest run of comment lines after the
			// opening (each ending in '\n'), and the block closes at the
			// last "# ///" line that is either inside that run or directly
			// ends it at the end of the input. A "# ///" right after the
			// opening cannot close: the content needs at least one line.
			contentStart := next
			closeOff, closeEnd, closeLine := -1, 0, 0
			j, jLine := next, line+1
			for {
				t, tnl, tnext := lineAt(code, j)
				if t == "# ///" && jLine >= line+2 {
					closeOff, closeEnd, closeLine = j, tnext, jLine
				}
				if !tnl || !isCommentLine(t) {
					break
				}
				j, jLine = tnext, jLine+1
			}
			if closeOff < 0 {
				// Nothing between here and the end of the run can close a
				// block either, so resume after the run.
				off, line = j, jLine
				continue
			}
			if !yield(block{typ: typ, content: code[contentStart:closeOff], start: line, end: closeLine}) {
				return
			}
			off, line = closeEnd, closeLine+1
		}
	}
}

// lineAt returns the line starting at byte offset off, whether a '\n' ends
// it, and the offset just past it.
func lineAt(s string, off int) (text string, nl bool, next int) {
	if i := strings.IndexByte(s[off:], '\n'); i >= 0 {
		return s[off : off+i], true, off + i + 1
	}
	return s[off:], false, len(s)
}

// openingType matches "^# /// (?P<type>[a-zA-Z0-9-]+)$" against one line.
func openingType(line string) (string, bool) {
	typ, ok := strings.CutPrefix(line, "# /// ")
	if !ok || typ == "" {
		return "", false
	}
	for i := 0; i < len(typ); i++ {
		if c := typ[i]; !isAlnum(c) && c != '-' {
			return "", false
		}
	}
	return typ, true
}

// isCommentLine matches "^#(| .*)$": "#" alone or "# " and anything.
func isCommentLine(line string) bool {
	return line == "#" || strings.HasPrefix(line, "# ")
}

// stripCommentPrefixes turns the block's comment lines into TOML by
// removing "# " (or the lone "#"), as the PEP's reference reader does.
func stripCommentPrefixes(content string) string {
	var b strings.Builder
	b.Grow(len(content))
	for line := range strings.SplitAfterSeq(content, "\n") {
		if rest, ok := strings.CutPrefix(line, "# "); ok {
			b.WriteString(rest)
		} else {
			b.WriteString(strings.TrimPrefix(line, "#"))
		}
	}
	return b.String()
}

func normalizeNewlines(s string) string {
	if !strings.Contains(s, "\r") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
}

// decodeMetadata parses the block's TOML and checks the fields PEP 723
// defines.
func decodeMetadata(content string, b block) (md *ScriptMetadata, problems []error) {
	md = &ScriptMetadata{}
	if line, msg := checkTOMLShape(content); msg != "" {
		return md, []error{fmt.Errorf("pep723: line %d: %s", b.start+line, msg)}
	}
	raw, err := decodeTOML(content)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			// Content line n is source line start+n.
			return md, []error{fmt.Errorf("pep723: line %d: invalid TOML in script metadata: %s", b.start+perr.Position.Line, perr.Message)}
		}
		return md, []error{fmt.Errorf("pep723: line %d: invalid TOML in script metadata: %w", b.start, err)}
	}

	if v, ok := raw["requires-python"]; ok {
		if s, ok := v.(string); !ok {
			problems = append(problems, fmt.Errorf("pep723: line %d: requires-python must be a string, not %s", b.keyLine("requires-python"), tomlType(v)))
		} else if _, err := ParseSpecifierSet(s); err != nil {
			problems = append(problems, fmt.Errorf("pep723: line %d: requires-python: %w", b.keyLine("requires-python"), err))
		} else {
			md.RequiresPython = s
		}
	}
	if v, ok := raw["dependencies"]; ok {
		list, ok := v.([]any)
		switch {
		case !ok:
			problems = append(problems, fmt.Errorf("pep723: line %d: dependencies must be a list of strings, not %s", b.keyLine("dependencies"), tomlType(v)))
		case len(list) > MaxDependencies:
			problems = append(problems, fmt.Errorf("pep723: line %d: too many dependencies (%d, limit %d)", b.keyLine("dependencies"), len(list), MaxDependencies))
		default:
			md.Dependencies = make([]string, 0, len(list))
			for i, item := range list {
				s, ok := item.(string)
				if !ok {
					problems = append(problems, &DependencyError{Line: b.keyLine("dependencies"), Index: i,
						Err: fmt.Errorf("must be a string, not %s", tomlType(item)), notString: true})
					continue
				}
				md.Entries = append(md.Entries, s)
				if _, err := ParseRequirement(s); err != nil {
					problems = append(problems, &DependencyError{Line: b.valueLine(s, "dependencies"), Index: i, Requirement: s, Err: err})
					continue
				}
				md.Dependencies = append(md.Dependencies, s)
			}
		}
	}
	return md, problems
}

// decodeTOML wraps toml.Decode. The TOML parser reports syntax errors
// through panics it recovers itself, and re-panics anything else; since its
// input comes from an agent, a bug there must become an error, not a crash
// of the server.
func decodeTOML(content string) (raw map[string]any, err error) {
	defer func() {
		if r := recover(); r != nil {
			raw, err = nil, fmt.Errorf("toml parser failed: %v", r)
		}
	}()
	_, err = toml.Decode(content, &raw)
	return raw, err
}

// keyLine returns the source line where a top-level key is set, or the
// block's opening line if it cannot tell. It is only used for messages.
func (b block) keyLine(key string) int {
	n := b.start
	for line := range strings.SplitSeq(b.content, "\n") {
		n++
		t := strings.TrimLeft(strings.TrimPrefix(line, "#"), " \t")
		if rest, ok := strings.CutPrefix(t, key); ok && strings.HasPrefix(strings.TrimLeft(rest, " \t"), "=") {
			return n
		}
	}
	return b.start
}

// valueLine returns the source line where the string s is written, falling
// back to the line of key. TOML escapes can make the written form differ
// from s; then the key's line is close enough.
func (b block) valueLine(s, key string) int {
	n := b.start
	for line := range strings.SplitSeq(b.content, "\n") {
		n++
		if strings.Contains(line, `"`+s+`"`) || strings.Contains(line, `'`+s+`'`) {
			return n
		}
	}
	return b.keyLine(key)
}

// tomlType names the TOML type of a decoded value for error messages.
func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case []any, []map[string]any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return "a date or time"
}

// checkTOMLShape rejects TOML that would be slow to parse: brackets or
// braces nested more than maxTOMLDepth deep, or more than maxTOMLLineDot
// dots on one line (a dotted key or table name can be no longer than its
// line). It reports the 1-based line of the problem within content.
//
// It follows TOML's string and comment syntax, so that brackets and dots
// inside strings ("pkg[extra]>=1.2.3") do not count, and it errs on the side
// of counting: dots in numbers and dates count too.
func checkTOMLShape(content string) (line int, msg string) {
	const (
		normal = iota
		comment
		basic     // "..."
		literal   // '...'
		mlBasic   // """..."""
		mlLiteral // '''...'''
	)
	state, depth, dots := normal, 0, 0
	line = 1
	for i := 0; i < len(content); i++ {
		c := content[i]
		if c == '\n' {
			line++
			dots = 0
			if state != mlBasic && state != mlLiteral {
				// Single-line strings and comments end here (an
				// unterminated string is a TOML error anyway).
				state = normal
			}
			continue
		}
		switch state {
		case normal:
			switch c {
			case '#':
				state = comment
			case '.':
				if dots++; dots > maxTOMLLineDot {
					return line, fmt.Sprintf("too many dotted parts on one line of script metadata (limit %d)", maxTOMLLineDot)
				}
			case '[', '{':
				if depth++; depth > maxTOMLDepth {
					return line, fmt.Sprintf("script metadata nested too deeply (limit %d)", maxTOMLDepth)
				}
			case ']', '}':
				depth = max(depth-1, 0)
			case '"', '\'':
				delim := strings.Repeat(string(c), 3)
				switch {
				case strings.HasPrefix(content[i:], delim) && c == '"':
					state, i = mlBasic, i+2
				case strings.HasPrefix(content[i:], delim):
					state, i = mlLiteral, i+2
				case c == '"':
					state = basic
				default:
					state = literal
				}
			}
		case basic:
			switch c {
			case '\\':
				if i+1 < len(content) && content[i+1] != '\n' {
					i++
				}
			case '"':
				state = normal
			}
		case literal:
			if c == '\'' {
				state = normal
			}
		case mlBasic, mlLiteral:
			q := byte('"')
			if state == mlLiteral {
				q = '\''
			}
			switch {
			case c == '\\' && state == mlBasic:
				// Skip the escaped character, but let a newline
				// (a line-ending backslash) be counted above.
				if i+1 < len(content) && content[i+1] != '\n' {
					i++
				}
			case c == q && strings.HasPrefix(content[i:], strings.Repeat(string(q), 3)):
				// A closing delimiter may be preceded by up to two
				// quotes that belong to the content: the string ends
				// at the end of the run.
				for i+1 < len(content) && content[i+1] == q {
					i++
				}
				state = normal
			}
		}
	}
	return 0, ""
}
