package relay

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The guards of the MCP fast path: the go-sdk patch in third_party/go-sdk
// must go when upstream no longer needs it, and readCalls must read every
// body as toolCalls does.

// patchedSDK is the go-sdk version third_party/go-sdk was copied from and
// checked against. Change it only after redoing the check in
// third_party/go-sdk/PATCH.md for the new version.
const patchedSDK = "v1.8.0"

const sdkPath = "github.com/modelcontextprotocol/go-sdk"

// TestSDKPatchStillNeeded fails when go.mod requires another go-sdk than
// the one patched, when upstream no longer has what one of the two changes
// works around (internal/json.Unmarshal building a Decoder per call,
// internal/jsonrpc2.jsonMarshal running encoding/json's Encoder), or when
// the copy lost a change.
func TestSDKPatchStillNeeded(t *testing.T) {
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var required string
	for line := range strings.Lines(string(mod)) {
		if f := strings.Fields(line); len(f) >= 2 && (f[0] == sdkPath || len(f) >= 3 && f[0] == "require" && f[1] == sdkPath) {
			if f[0] == "require" {
				f = f[1:]
			}
			required = f[1]
		}
	}
	switch {
	case required == "":
		t.Fatalf("go.mod requires no %s: drop third_party/go-sdk and its replace line", sdkPath)
	case required != patchedSDK:
		t.Fatalf("go.mod requires %s %s but third_party/go-sdk patches %s: re-check the patch (third_party/go-sdk/PATCH.md), then update patchedSDK",
			sdkPath, required, patchedSDK)
	}
	if !strings.Contains(string(mod), sdkPath+" => ./third_party/go-sdk") {
		t.Fatalf("go.mod does not replace %s with ./third_party/go-sdk: drop the copy and this test", sdkPath)
	}

	// The upstream source, from the module cache or downloaded into it. Run
	// outside this module so that go.sum is left alone.
	cmd := exec.Command("go", "mod", "download", "-json", sdkPath+"@"+required)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GO111MODULE=on")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go mod download %s@%s: %v\n%s%s\n(needs the go command and the module cache or network access to the module proxy)",
			sdkPath, required, err, out, stderr)
	}
	var dl struct{ Dir, Error string }
	if err := json.Unmarshal(out, &dl); err != nil || dl.Dir == "" {
		t.Fatalf("go mod download gave no directory: %v %s %s", err, dl.Error, out)
	}
	src, err := os.ReadFile(filepath.Join(dl.Dir, "internal", "json", "json.go"))
	if err != nil {
		t.Fatalf("upstream internal/json moved: %v; re-check the patch", err)
	}
	unmarshal := funcBody(string(src), "func Unmarshal(")
	if unmarshal == "" {
		t.Fatalf("upstream %s internal/json/json.go has no func Unmarshal; re-check the patch", required)
	}
	if !strings.Contains(unmarshal, "NewDecoder(bytes.NewReader(data))") {
		t.Errorf("upstream no longer builds a Decoder per Unmarshal: drop that change (third_party/go-sdk/PATCH.md)\n%s", unmarshal)
	}

	// The second change: jsonMarshal and EncodeMessage skip encoding/json's
	// re-scan of compact JSON. It is needed while upstream's jsonMarshal
	// runs encoding/json's Encoder.
	src, err = os.ReadFile(filepath.Join(dl.Dir, "internal", "jsonrpc2", "messages.go"))
	if err != nil {
		t.Fatalf("upstream internal/jsonrpc2 moved: %v; re-check the patch", err)
	}
	if marshal := funcBody(string(src), "func jsonMarshal("); !strings.Contains(marshal, "json.NewEncoder(") {
		t.Errorf("upstream jsonMarshal no longer runs encoding/json's Encoder: drop that change (third_party/go-sdk/PATCH.md)\n%s", marshal)
	}

	// And the copy still carries both changes.
	ours, err := os.ReadFile("../third_party/go-sdk/internal/json/json.go")
	if err != nil {
		t.Fatal(err)
	}
	if mine := funcBody(string(ours), "func Unmarshal("); strings.Contains(mine, "NewDecoder(bytes.NewReader(data))") && !strings.Contains(mine, "json.Parse(") {
		t.Errorf("third_party/go-sdk lost its Unmarshal patch:\n%s", mine)
	}
	ours, err = os.ReadFile("../third_party/go-sdk/internal/jsonrpc2/messages.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []string{"func jsonMarshal(", "func EncodeMessage("} {
		if mine := funcBody(string(ours), sig); !strings.Contains(mine, "isCompact(") {
			t.Errorf("third_party/go-sdk lost its patch of %s):\n%s", sig, mine)
		}
	}
}

// funcBody is the text of the top-level function starting with sig, up to
// the closing brace at the start of a line.
func funcBody(src, sig string) string {
	i := strings.Index(src, "\n"+sig)
	if i < 0 {
		return ""
	}
	j := strings.Index(src[i:], "\n}\n")
	if j < 0 {
		return src[i:]
	}
	return src[i : i+j+3]
}

var callBodies = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"memory_get","arguments":{"code":"abc"}}}`,
	` { "jsonrpc" : "2.0" , "id" : 1 , "method" : "tools/call" , "params" : { "name" : "memory_get" , "arguments" : { "code" : "abc" } } } `,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"memory_get"}}`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"memory_get","arguments":null}}`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{}},"params":{"name":"b","arguments":[1]}}`,
	`{"method":"tools/call","method":"tools/list","params":{"name":"a"}}`,
	`{"method":"tools/list","method":"tools/call","params":{"name":"a","name":"b"}}`,
	`{"method":"tools\/call","params":{"name":"a"}}`,
	`{"Method":"tools/call","params":{"name":"a"}}`,
	`{"me\u0074hod":"tools/call","params":{"name":"a"}}`,
	`{"method":"tools/call","params":{"n\u0061me":"a"}}`,
	`{"method":"tools/call","params":{"name":"caf\u00e9"}}`,
	`{"method":"tools/call","params":{"name":"café"}}`,
	`{"method":"tools/call","params":{"name":"` + "\xff" + `"}}`,
	`{"method":"tools/call","params":{"name":7}}`,
	`{"method":"tools/call","params":null}`,
	`{"method":"tools/call","params":[1,2]}`,
	`{"method":"tools/call","params":"x"}`,
	`{"method":"tools/call"}`,
	`{"method":null,"params":{"name":"a"}}`,
	`{"method":7}`,
	`{"method":"tools/list","id":2}`,
	`{"id":"}{\"method\":\"tools/call\"","method":"ping"}`,
	`{"params":{"arguments":{"method":"tools/call"},"name":"x"},"method":"tools/call"}`,
	`{"method":"tools/call","params":{"name":"x","arguments":{"a":[1,{"b":"}]"}],"c":"\"}"}}}`,
	`{"method":"tools/call","params":{"name":"x","arguments":  {"agent_id":"k"}  ,"x":1}}`,
	`{"method":"tools/call","params":{"name":"x","arguments":-1.5e3}}`,
	`{"method":"tools/call","params":{"name":"x","arguments":true}}`,
	`{}`,
	`[]`,
	`null`,
	`"tools/call"`,
	`[{"method":"tools/call","params":{"name":"a"}},{"method":"ping"}]`,
	`{"method":"tools/call","params":{"name":"a"}`,
	`{"method":"tools/call","params":{"name":"a"}} {}`,
	``,
	`{"method":"tools/call","params":{"name":"a",}}`,
}

// TestReadCallsMatchesToolCalls: the fast reading of an MCP body and the
// decoding one agree on every body, valid or not.
func TestReadCallsMatchesToolCalls(t *testing.T) {
	for _, body := range callBodies {
		checkReadCalls(t, []byte(body))
	}
	// The fast path must be the one taken for an ordinary tools/call.
	if _, simple, isCall := plainCall([]byte(callBodies[0])); !simple || !isCall {
		t.Errorf("an ordinary tools/call is not read by the fast path")
	}
}

func FuzzReadCalls(f *testing.F) {
	for _, body := range callBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkReadCalls(t, body) })
}

func checkReadCalls(t *testing.T, body []byte) {
	t.Helper()
	kept := bytes.Clone(body)
	gotCalls, gotBatch, gotOK := readCalls(body)
	wantCalls, wantBatch, wantOK := toolCalls(body)
	if gotBatch != wantBatch || gotOK != wantOK || !reflect.DeepEqual(gotCalls, wantCalls) {
		t.Errorf("%s:\nreadCalls %+v %v %v\ntoolCalls %+v %v %v", body, gotCalls, gotBatch, gotOK, wantCalls, wantBatch, wantOK)
	}
	if !bytes.Equal(body, kept) {
		t.Errorf("readCalls changed its input")
	}
}
