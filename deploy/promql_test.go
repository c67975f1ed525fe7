package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// selector is a metric a PromQL expression reads, with the labels its matchers name.
type selector struct {
	metric string
	labels []string
}

// query is what the dashboard test needs of one PromQL expression: the metrics it reads and the labels it
// groups by (by, without, on, ignoring). A small tokenizer, not a parser: it skips strings, range and subquery
// brackets and numbers, and tells function names (an identifier before "(") from metric names. It is enough for
// the dashboard's expressions, which the test also rejects if they use syntax the tokenizer does not read.
type query struct {
	selectors []selector
	grouping  []string
}

var promKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
}

var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

var groupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true}

func identStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
func identChar(c byte) bool { return identStart(c) || c >= '0' && c <= '9' }

// parsePromQL reads expr.
func parsePromQL(expr string) (query, error) {
	var q query
	i := 0
	skipSpace := func() {
		for i < len(expr) && strings.IndexByte(" \t\n\r", expr[i]) >= 0 {
			i++
		}
	}
	ident := func() string {
		start := i
		for i < len(expr) && identChar(expr[i]) {
			i++
		}
		return expr[start:i]
	}
	str := func() error { // at a quote: skip the string literal
		quote := expr[i]
		for i++; i < len(expr); i++ {
			switch {
			case expr[i] == '\\' && quote != '`':
				i++
			case expr[i] == quote:
				i++
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	labelList := func() ([]string, error) { // at "(": identifiers separated by commas, then ")"
		var names []string
		for i++; ; {
			skipSpace()
			if i >= len(expr) {
				return nil, fmt.Errorf("unterminated label list in %q", expr)
			}
			switch c := expr[i]; {
			case c == ')':
				i++
				return names, nil
			case c == ',':
				i++
			case identStart(c):
				names = append(names, ident())
			default:
				return nil, fmt.Errorf("unexpected %q in a label list of %q", c, expr)
			}
		}
	}
	for {
		skipSpace()
		if i >= len(expr) {
			return q, nil
		}
		switch c := expr[i]; {
		case c == '"' || c == '\'' || c == '`':
			if err := str(); err != nil {
				return q, err
			}
		case c == '[':
			end := strings.IndexByte(expr[i:], ']')
			if end < 0 {
				return q, fmt.Errorf("unterminated [ in %q", expr)
			}
			i += end + 1
		case c == '{':
			if len(q.selectors) == 0 || q.selectors[len(q.selectors)-1].labels != nil {
				return q, fmt.Errorf("a label matcher without a metric name in %q", expr)
			}
			sel := &q.selectors[len(q.selectors)-1]
			sel.labels = []string{}
			for i++; ; {
				skipSpace()
				if i >= len(expr) {
					return q, fmt.Errorf("unterminated { in %q", expr)
				}
				c := expr[i]
				if c == '}' {
					i++
					break
				}
				switch {
				case identStart(c):
					sel.labels = append(sel.labels, ident())
				case c == '"' || c == '\'' || c == '`':
					if err := str(); err != nil {
						return q, err
					}
				case strings.IndexByte("=!~,", c) >= 0:
					i++
				default:
					return q, fmt.Errorf("unexpected %q in a label matcher of %q", c, expr)
				}
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (identChar(expr[i]) || expr[i] == '.') {
				i++
			}
		case c == '$':
			return q, fmt.Errorf("a dashboard variable outside a string or a range in %q", expr)
		case identStart(c):
			name := ident()
			skipSpace()
			next := byte(0)
			if i < len(expr) {
				next = expr[i]
			}
			switch {
			case groupingKeywords[name]:
				if next != '(' {
					return q, fmt.Errorf("%s without a label list in %q", name, expr)
				}
				names, err := labelList()
				if err != nil {
					return q, err
				}
				q.grouping = append(q.grouping, names...)
			case promKeywords[strings.ToLower(name)]:
			case next == '(': // a function or an aggregation
			case aggregations[name] && (strings.HasPrefix(expr[i:], "by") || strings.HasPrefix(expr[i:], "without")):
				// sum by (...) (...): the grouping comes first
			default:
				q.selectors = append(q.selectors, selector{metric: name})
			}
		default:
			i++ // operators, parentheses, commas
		}
	}
}

func TestParsePromQL(t *testing.T) {
	for _, tc := range []struct {
		expr     string
		metrics  []string
		labels   [][]string
		grouping []string
	}{
		{`histogram_quantile(0.99, sum by (le, backend) (rate(x_bucket{backend=~"$backend", a!="}"}[$__rate_interval])))`,
			[]string{"x_bucket"}, [][]string{{"backend", "a"}}, []string{"le", "backend"}},
		{`sum by (m) (rate(a_total[5m])) / sum(rate(b_total{m="x"}[1h:1m])) > 0.5`,
			[]string{"a_total", "b_total"}, [][]string{nil, {"m"}}, []string{"m"}},
		{`time() - max(ts_seconds) and on (job) up offset 5m`, []string{"ts_seconds", "up"}, [][]string{nil, nil}, []string{"job"}},
	} {
		q, err := parsePromQL(tc.expr)
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		var metrics []string
		for i, s := range q.selectors {
			metrics = append(metrics, s.metric)
			if len(s.labels) > 0 || len(tc.labels[i]) > 0 {
				if !slices.Equal(s.labels, tc.labels[i]) {
					t.Errorf("%s: %s labels %v, want %v", tc.expr, s.metric, s.labels, tc.labels[i])
				}
			}
		}
		if !slices.Equal(metrics, tc.metrics) || !slices.Equal(q.grouping, tc.grouping) {
			t.Errorf("%s: metrics %v grouping %v, want %v %v", tc.expr, metrics, q.grouping, tc.metrics, tc.grouping)
		}
	}
	for _, bad := range []string{`{__name__="x"}`, `sum by le (x)`, `x{a="b`, `rate(x[5m)`, `x > $threshold`} {
		if _, err := parsePromQL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
