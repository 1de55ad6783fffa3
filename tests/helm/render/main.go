// sluice-helm-render renders a Helm chart the way `helm template` does, for the chart tests
// (there is no helm binary here). It uses Helm's own engine — Go text/template with sprig v3
// and sigs.k8s.io/yaml — plus the pieces Helm adds on top: include, tpl, required, toYaml,
// fromYaml, toJson, fromJson, lookup (always empty, as in `helm template`), .Values (chart
// defaults coalesced with -f files and --set), .Release, .Chart, .Capabilities, .Template,
// the values.schema.json check, the "<no value>" clean-up and splitting into documents.
// Not covered: subcharts and dependencies, .Files, library charts, hooks' ordering, --set's
// index syntax (a[0]=x), --set-file, --set-json, post-renderers.
//
// Usage: sluice-helm-render -chart DIR [-f values.yaml]... [-set a.b=c,l={x,y}]...
//
//	[-set-string k=v]... [-name sluice] [-namespace kube-system] [-o yaml|json] [-notes]
//	[-skip-schema-validation]
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	// Debian's golang-github-masterminds-sprig-dev installs sprig v3 without the /v3 suffix.
	"github.com/Masterminds/sprig"
	"github.com/xeipuuv/gojsonschema"
	"sigs.k8s.io/yaml"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// setEntry keeps --set and --set-string in command-line order, as Helm applies them.
type setEntry struct {
	text  string
	typed bool
}

type setFlag struct {
	entries *[]setEntry
	typed   bool
}

func (s setFlag) String() string { return "" }
func (s setFlag) Set(v string) error {
	*s.entries = append(*s.entries, setEntry{v, s.typed})
	return nil
}

func main() {
	chartDir := flag.String("chart", "", "the chart directory")
	name := flag.String("name", "sluice", "the release name")
	namespace := flag.String("namespace", "default", "the release namespace")
	kubeVersion := flag.String("kube-version", "v1.29.0", ".Capabilities.KubeVersion")
	output := flag.String("o", "yaml", "yaml (documents with # Source: lines) or json (one array)")
	notes := flag.Bool("notes", false, "print the rendered NOTES.txt instead of the manifests")
	skipSchema := flag.Bool("skip-schema-validation", false, "as helm's: values.schema.json unchecked")
	var valueFiles multiFlag
	var sets []setEntry
	flag.Var(&valueFiles, "f", "a values file (repeatable; later ones win)")
	flag.Var(setFlag{&sets, true}, "set", "key=value[,key=value] (repeatable)")
	flag.Var(setFlag{&sets, false}, "set-string", "key=value, the value kept a string")
	flag.Parse()
	if *chartDir == "" {
		fail(errors.New("-chart is required"))
	}
	docs, notesText, err := render(*chartDir, *name, *namespace, *kubeVersion, valueFiles, sets,
		*skipSchema)
	if err != nil {
		fail(err)
	}
	if *notes {
		fmt.Print(notesText)
		return
	}
	switch *output {
	case "json":
		var objs []interface{}
		for _, d := range docs {
			objs = append(objs, map[string]interface{}{"source": d.source, "object": d.object})
		}
		out, _ := json.MarshalIndent(objs, "", "  ")
		fmt.Println(string(out))
	default:
		for _, d := range docs {
			fmt.Printf("---\n# Source: %s\n%s\n", d.source, strings.TrimSpace(d.text))
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "Error: %v\n", err)
	os.Exit(1)
}

type document struct {
	source string
	text   string
	object interface{}
}

func readYAMLMap(file string) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if m == nil {
		m = map[string]interface{}{}
	}
	return m, nil
}

func render(chartDir, name, namespace, kubeVersion string, valueFiles []string,
	sets []setEntry, skipSchema bool) ([]document, string, error) {
	chartMeta, err := readYAMLMap(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return nil, "", err
	}
	chart := chartObject(chartMeta)
	chartName, _ := chart["Name"].(string)
	if chartName == "" {
		return nil, "", errors.New("Chart.yaml: name is required")
	}

	values, err := readYAMLMap(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return nil, "", err
	}
	for _, f := range valueFiles {
		user, err := readYAMLMap(f)
		if err != nil {
			return nil, "", err
		}
		coalesce(values, user)
	}
	for _, s := range sets {
		user := map[string]interface{}{}
		if err := parseSet(s.text, s.typed, user); err != nil {
			return nil, "", fmt.Errorf("failed parsing --set data: %w", err)
		}
		coalesce(values, user)
	}
	if !skipSchema {
		if err := checkSchema(chartDir, chartName, values); err != nil {
			return nil, "", err
		}
	}

	top := map[string]interface{}{
		"Values": values,
		"Chart":  chart,
		"Release": map[string]interface{}{
			"Name": name, "Namespace": namespace, "Service": "Helm", "Revision": 1,
			"IsInstall": true, "IsUpgrade": false,
		},
		"Capabilities": capabilities(kubeVersion),
	}

	// Every file under templates/ is parsed into one set, so any can include another's define.
	templatesDir := filepath.Join(chartDir, "templates")
	var files []string
	err = filepath.WalkDir(templatesDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		return nil, "", err
	}
	sort.Strings(files)
	root := template.New("gotpl").Option("missingkey=zero")
	root.Funcs(funcMap(root))
	var names []string
	for _, f := range files {
		rel, _ := filepath.Rel(chartDir, f)
		tname := path.Join(chartName, filepath.ToSlash(rel))
		text, err := os.ReadFile(f)
		if err != nil {
			return nil, "", err
		}
		if _, err := root.New(tname).Parse(string(text)); err != nil {
			return nil, "", fmt.Errorf("parse error: %w", err)
		}
		names = append(names, tname)
	}

	var docs []document
	notes := ""
	for _, tname := range names {
		base := path.Base(tname)
		if strings.HasPrefix(base, "_") {
			continue // partials only define templates
		}
		data := map[string]interface{}{}
		for k, v := range top {
			data[k] = v
		}
		data["Template"] = map[string]interface{}{
			"Name": tname, "BasePath": path.Join(chartName, "templates"),
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, tname, data); err != nil {
			return nil, "", cleanExecError(err)
		}
		out := strings.ReplaceAll(buf.String(), "<no value>", "")
		if base == "NOTES.txt" {
			notes = out
			continue
		}
		if !strings.HasSuffix(base, ".yaml") && !strings.HasSuffix(base, ".yml") &&
			!strings.HasSuffix(base, ".tpl") {
			continue
		}
		for _, part := range docSplit.Split("\n"+out, -1) {
			if strings.TrimSpace(part) == "" {
				continue
			}
			var obj interface{}
			if err := yaml.Unmarshal([]byte(part), &obj); err != nil {
				return nil, "", fmt.Errorf("YAML parse error on %s: %w\n%s", tname, err, part)
			}
			if obj == nil {
				continue // only comments
			}
			docs = append(docs, document{source: tname, text: part, object: obj})
		}
	}
	return docs, notes, nil
}

var docSplit = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// chartObject gives Chart.yaml's keys the names Helm's .Chart has (name -> Name,
// appVersion -> AppVersion, apiVersion -> APIVersion).
func chartObject(meta map[string]interface{}) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range meta {
		switch k {
		case "apiVersion":
			out["APIVersion"] = v
		case "kubeVersion":
			out["KubeVersion"] = v
		default:
			out[strings.ToUpper(k[:1])+k[1:]] = v
		}
	}
	return out
}

type apiVersions []string

// Has is .Capabilities.APIVersions.Has "apps/v1" (or "apps/v1/DaemonSet").
func (a apiVersions) Has(v string) bool {
	for _, x := range a {
		if x == v || strings.HasPrefix(v, x+"/") {
			return true
		}
	}
	return false
}

func capabilities(kubeVersion string) map[string]interface{} {
	v := strings.TrimPrefix(kubeVersion, "v")
	parts := strings.SplitN(v, ".", 3)
	for len(parts) < 2 {
		parts = append(parts, "0")
	}
	return map[string]interface{}{
		"KubeVersion": map[string]interface{}{
			"Version": "v" + v, "GitVersion": "v" + v, "Major": parts[0], "Minor": parts[1],
		},
		"APIVersions": apiVersions{"v1", "apps/v1", "rbac.authorization.k8s.io/v1",
			"coordination.k8s.io/v1", "discovery.k8s.io/v1", "networking.k8s.io/v1",
			"policy/v1", "scheduling.k8s.io/v1", "apiextensions.k8s.io/v1",
			"monitoring.coreos.com/v1"},
		"HelmVersion": map[string]interface{}{"Version": "v3.14.0"},
	}
}

func funcMap(root *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env") // Helm removes these two: a chart must not read the renderer's environment
	delete(f, "expandenv")
	includeDepth := map[string]int{}
	f["toYaml"] = func(v interface{}) string {
		out, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(out), "\n")
	}
	f["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromYamlArray"] = func(s string) []interface{} {
		var a []interface{}
		if err := yaml.Unmarshal([]byte(s), &a); err != nil {
			a = []interface{}{err.Error()}
		}
		return a
	}
	f["toJson"] = func(v interface{}) string {
		out, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(out)
	}
	f["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["include"] = func(name string, data interface{}) (string, error) {
		if includeDepth[name] > 1000 {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		includeDepth[name]++
		defer func() { includeDepth[name]-- }()
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", fmt.Errorf("cannot parse template %q: %w", text, err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", text, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	f["required"] = func(warn string, v interface{}) (interface{}, error) {
		if v == nil {
			return v, errors.New(warn)
		}
		if s, ok := v.(string); ok && s == "" {
			return v, errors.New(warn)
		}
		return v, nil
	}
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	return f
}

// cleanExecError turns text/template's "template: X:3:4: executing "X" at <fail ...>: error
// calling fail: MSG" (nested once per include) into Helm's "execution error at (X:3:4): MSG".
var execAt = regexp.MustCompile(`^template: ([^ ]+?): executing`)

func cleanExecError(err error) error {
	text := err.Error()
	const marker = "error calling fail: "
	i := strings.LastIndex(text, marker)
	m := execAt.FindStringSubmatch(text)
	if i < 0 || m == nil {
		return err
	}
	return fmt.Errorf("execution error at (%s): %s", m[1], text[i+len(marker):])
}

// coalesce merges src into dst as Helm does for user values: maps merge key by key, anything
// else replaces, and a null removes the key.
func coalesce(dst, src map[string]interface{}) {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				coalesce(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// parseSet reads Helm's --set syntax: comma-separated key=value, dotted keys for nesting,
// {a,b} for a list, backslash to escape a comma or dot. Typed values become bool, int64 or null
// like Helm's; --set-string keeps strings.
func parseSet(s string, typed bool, into map[string]interface{}) error {
	for _, item := range splitTop(s, ',') {
		if item == "" {
			continue
		}
		eq := strings.IndexByte(item, '=')
		if eq < 0 {
			return fmt.Errorf("key %q has no value", item)
		}
		key, raw := item[:eq], item[eq+1:]
		if strings.ContainsAny(key, "[]") {
			return fmt.Errorf("key %q: list indexes are not supported by this renderer", key)
		}
		var val interface{}
		if strings.HasPrefix(raw, "{") && strings.HasSuffix(raw, "}") {
			var list []interface{}
			for _, x := range splitTop(raw[1:len(raw)-1], ',') {
				list = append(list, scalar(unescape(x), typed))
			}
			if list == nil {
				list = []interface{}{}
			}
			val = list
		} else {
			val = scalar(unescape(raw), typed)
		}
		parts := splitTop(key, '.')
		m := into
		for _, p := range parts[:len(parts)-1] {
			p = unescape(p)
			next, ok := m[p].(map[string]interface{})
			if !ok {
				next = map[string]interface{}{}
				m[p] = next
			}
			m = next
		}
		m[unescape(parts[len(parts)-1])] = val
	}
	return nil
}

// splitTop splits on sep outside {} and not after a backslash (which it keeps).
func splitTop(s string, sep byte) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\':
			i++
		case s[i] == '{':
			depth++
		case s[i] == '}':
			depth--
		case s[i] == sep && depth == 0:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func scalar(s string, typed bool) interface{} {
	if !typed {
		return s
	}
	switch s {
	case "true":
		return true
	case "false":
		return false
	case "null":
		return nil
	}
	// Helm: integers without a leading zero become int64; everything else stays a string.
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && (s == "0" || !strings.HasPrefix(s, "0")) {
		return n
	}
	return s
}

// checkSchema validates the coalesced values against values.schema.json when the chart has one.
func checkSchema(chartDir, chartName string, values map[string]interface{}) error {
	schema, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	// Round-trip through JSON so int64 from --set and float64 from YAML compare alike.
	raw, err := json.Marshal(values)
	if err != nil {
		return err
	}
	res, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema),
		gojsonschema.NewBytesLoader(raw))
	if err != nil {
		return fmt.Errorf("values.schema.json: %w", err)
	}
	if res.Valid() {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n", chartName)
	for _, e := range res.Errors() {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return errors.New(strings.TrimSuffix(b.String(), "\n"))
}
