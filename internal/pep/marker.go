package pep

import (
	"strings"
)

// markerVariables are the environment marker variables PEP 508 defines.
var markerVariables = map[string]bool{
	"python_version":                 true,
	"python_full_version":            true,
	"os_name":                        true,
	"sys_platform":                   true,
	"platform_release":               true,
	"platform_system":                true,
	"platform_version":               true,
	"platform_machine":               true,
	"platform_python_implementation": true,
	"implementation_name":            true,
	"implementation_version":         true,
	"extra":                          true,
}

// versionMarkers hold PEP 440 versions, so comparing them with a version
// operator is a version comparison and the literal must be a version.
var versionMarkers = map[string]bool{
	"python_version":         true,
	"python_full_version":    true,
	"implementation_version": true,
}

// legacyMarkers are pre-PEP 508 spellings that packaging still accepts.
// They are rejected, but with the replacement in the message.
var legacyMarkers = map[string]string{
	"os.name":                        "os_name",
	"sys.platform":                   "sys_platform",
	"platform.version":               "platform_version",
	"platform.machine":               "platform_machine",
	"platform.python_implementation": "platform_python_implementation",
	"python_implementation":          "platform_python_implementation",
}

// maxMarkerDepth bounds parenthesis nesting in a marker. Real markers nest
// once or twice; the bound keeps recursion shallow on hostile input.
const maxMarkerDepth = 32

// A markerNode is a parsed marker expression. Only its canonical spelling
// is kept: that is what requirements are compared by.
type markerNode interface {
	appendTo(b *strings.Builder)
}

// markerBool is "lhs and rhs" or "lhs or rhs".
type markerBool struct {
	op       string
	lhs, rhs markerNode
}

func (m *markerBool) appendTo(b *strings.Builder) {
	for i, side := range []markerNode{m.lhs, m.rhs} {
		if i == 1 {
			b.WriteString(" " + m.op + " ")
		}
		// "and" binds tighter than "or", so an "or" under an "and" is
		// the only place parentheses are needed.
		if inner, ok := side.(*markerBool); ok && m.op == "and" && inner.op == "or" {
			b.WriteByte('(')
			side.appendTo(b)
			b.WriteByte(')')
			continue
		}
		side.appendTo(b)
	}
}

// markerCmp is "lhs op rhs" where one side is a variable and the other a
// quoted string.
type markerCmp struct {
	lhs, rhs markerValue
	op       string
}

func (m *markerCmp) appendTo(b *strings.Builder) {
	m.lhs.appendTo(b)
	b.WriteString(" " + m.op + " ")
	m.rhs.appendTo(b)
}

// markerValue is a marker variable or the contents of a quoted string.
type markerValue struct {
	s     string
	isVar bool
	pos   int // byte offset in the input, for errors
}

func (v markerValue) appendTo(b *strings.Builder) {
	if v.isVar {
		b.WriteString(v.s)
		return
	}
	// Python strings in markers have no escapes, so the quote must be one
	// the value does not contain; the grammar guarantees that one of the
	// two works.
	q := `"`
	if strings.Contains(v.s, `"`) {
		q = `'`
	}
	b.WriteString(q + v.s + q)
}

// parseQuotedMarker parses the marker after ';' (already consumed) up to
// the end of the input.
func (p *scanner) parseQuotedMarker(r *Requirement) error {
	start := p.pos
	p.skipWS()
	if p.eof() {
		return p.errorf(p.pos, "expected a marker after \";\"")
	}
	node, err := p.parseMarkerOr(0)
	if err != nil {
		return err
	}
	p.skipWS()
	if !p.eof() {
		if p.peek() == ')' {
			return p.errorf(p.pos, "unmatched \")\" in marker")
		}
		return p.errorf(p.pos, "unexpected %s in marker; expected \"and\", \"or\" or end", p.describe(p.pos))
	}
	var b strings.Builder
	node.appendTo(&b)
	r.Marker = strings.Trim(p.src[start:], " \t")
	r.marker = b.String()
	return nil
}

// parseMarkerOr parses marker_and (wsp* 'or' marker_and)*. PEP 508's
// grammar as printed allows only one "or"; packaging and every installer
// accept chains, and so does this.
func (p *scanner) parseMarkerOr(depth int) (markerNode, error) {
	lhs, err := p.parseMarkerAnd(depth)
	if err != nil {
		return nil, err
	}
	for p.keyword("or") {
		rhs, err := p.parseMarkerAnd(depth)
		if err != nil {
			return nil, err
		}
		lhs = &markerBool{op: "or", lhs: lhs, rhs: rhs}
	}
	return lhs, nil
}

// parseMarkerAnd parses marker_expr (wsp* 'and' marker_expr)*.
func (p *scanner) parseMarkerAnd(depth int) (markerNode, error) {
	lhs, err := p.parseMarkerExpr(depth)
	if err != nil {
		return nil, err
	}
	for p.keyword("and") {
		rhs, err := p.parseMarkerExpr(depth)
		if err != nil {
			return nil, err
		}
		lhs = &markerBool{op: "and", lhs: lhs, rhs: rhs}
	}
	return lhs, nil
}

// keyword consumes optional whitespace and word if word comes next as a
// whole word (not as the start of a longer one).
func (p *scanner) keyword(word string) bool {
	save := p.pos
	p.skipWS()
	rest := p.src[p.pos:]
	if strings.HasPrefix(rest, word) && (len(rest) == len(word) || !isMarkerWordChar(rest[len(word)])) {
		p.pos += len(word)
		return true
	}
	p.pos = save
	return false
}

func isMarkerWordChar(c byte) bool { return isAlnum(c) || c == '_' || c == '.' }

// parseMarkerExpr parses marker_expr: a comparison or a parenthesised
// marker.
func (p *scanner) parseMarkerExpr(depth int) (markerNode, error) {
	p.skipWS()
	if p.peek() == '(' {
		if depth >= maxMarkerDepth {
			return nil, p.errorf(p.pos, "marker nested too deeply (limit %d)", maxMarkerDepth)
		}
		open := p.pos
		p.pos++
		node, err := p.parseMarkerOr(depth + 1)
		if err != nil {
			return nil, err
		}
		p.skipWS()
		switch {
		case p.peek() == ')':
			p.pos++
			return node, nil
		case p.eof():
			return nil, p.errorf(open, "unclosed \"(\" in marker")
		default:
			return nil, p.errorf(p.pos, "expected \"and\", \"or\" or \")\" in marker, found %s", p.describe(p.pos))
		}
	}
	lhs, err := p.parseMarkerValue()
	if err != nil {
		return nil, err
	}
	op, err := p.parseMarkerOp()
	if err != nil {
		return nil, err
	}
	rhs, err := p.parseMarkerValue()
	if err != nil {
		return nil, err
	}
	if err := p.checkComparison(lhs, op, rhs); err != nil {
		return nil, err
	}
	return &markerCmp{lhs: lhs, op: op, rhs: rhs}, nil
}

// parseMarkerValue parses marker_var: a PEP 508 variable or a quoted
// string.
func (p *scanner) parseMarkerValue() (markerValue, error) {
	p.skipWS()
	pos := p.pos
	switch q := p.peek(); q {
	case '"', '\'':
		end := strings.IndexByte(p.src[pos+1:], q)
		if end < 0 {
			return markerValue{}, p.errorf(pos, "unterminated string in marker")
		}
		p.pos = pos + 1 + end + 1
		return markerValue{s: p.src[pos+1 : pos+1+end], pos: pos}, nil
	case 0:
		return markerValue{}, p.errorf(pos, "expected a marker variable or quoted string, found end of input")
	}
	word := p.span(isMarkerWordChar)
	switch {
	case word == "":
		return markerValue{}, p.errorf(pos, "expected a marker variable or quoted string, found %s", p.describe(pos))
	case markerVariables[word]:
		return markerValue{s: word, isVar: true, pos: pos}, nil
	case legacyMarkers[word] != "":
		return markerValue{}, p.errorf(pos, "unknown marker variable %q, use %q", word, legacyMarkers[word])
	case isDigit(word[0]):
		return markerValue{}, p.errorf(pos, "marker values must be quoted, as in \"%s\"", word)
	case word == "and" || word == "or" || word == "not" || word == "in":
		return markerValue{}, p.errorf(pos, "expected a marker variable or quoted string, found %q", word)
	}
	return markerValue{}, p.errorf(pos, "unknown marker variable %q", word)
}

// parseMarkerOp parses marker_op: a version comparison operator, "in" or
// "not in".
func (p *scanner) parseMarkerOp() (string, error) {
	p.skipWS()
	pos := p.pos
	if op, ok := p.parseOperator(); ok {
		return op, nil
	}
	switch p.span(isMarkerWordChar) {
	case "in":
		return "in", nil
	case "not":
		if !isWS(p.peek()) {
			return "", p.errorf(p.pos, "expected whitespace and \"in\" after \"not\"")
		}
		p.skipWS()
		inPos := p.pos
		if p.span(isMarkerWordChar) != "in" {
			return "", p.errorf(inPos, "expected \"in\" after \"not\"")
		}
		return "not in", nil
	}
	p.pos = pos
	if p.peek() == '=' {
		return "", p.errorf(pos, "\"=\" is not an operator, use \"==\"")
	}
	return "", p.errorf(pos, "expected a marker operator (one of == != < <= > >= ~= === in, not in), found %s", p.describe(pos))
}

// checkComparison rejects comparisons that parse but can never be
// evaluated sensibly. packaging accepts them and fails (or silently
// compares strings) at install time; an agent is better served by an error
// now.
func (p *scanner) checkComparison(lhs markerValue, op string, rhs markerValue) error {
	switch {
	case lhs.isVar && rhs.isVar:
		return p.errorf(lhs.pos, "marker compares two variables; one side must be a quoted string")
	case !lhs.isVar && !rhs.isVar:
		return p.errorf(lhs.pos, "marker compares two quoted strings; one side must be a variable such as python_version")
	}
	versionOp := op != "in" && op != "not in" && op != "==="
	switch {
	case versionOp && lhs.isVar && (versionMarkers[lhs.s] || op == "~="):
		// The literal becomes the version in a specifier.
		if _, msg := newSpecifier(op, strings.Trim(rhs.s, " \t")); msg != "" {
			return p.errorf(rhs.pos, "%s in marker", msg)
		}
	case versionOp && rhs.isVar && versionMarkers[rhs.s]:
		// The literal is the version tested against the variable.
		if _, ok := parseVersion(strings.Trim(lhs.s, " \t")); !ok {
			return p.errorf(lhs.pos, "invalid version %q in marker", lhs.s)
		}
	}
	return nil
}
