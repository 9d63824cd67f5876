package server_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
)

// fuzzedProcedures are the unary methods FuzzAPI posts to: writes with
// specs, labels and policies, reads with page tokens and selectors, the
// admin and the host API.
var fuzzedProcedures = []string{
	"/kibotos.ctrl.v1.EgressService/CreateEgress",
	"/kibotos.ctrl.v1.EgressService/ListEgresses",
	"/kibotos.ctrl.v1.EgressService/UpdateEgressLabels",
	"/kibotos.ctrl.v1.ResolverService/CreateResolver",
	"/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace",
	"/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceNetworkPolicy",
	"/kibotos.ctrl.v1.VolumeService/CreateVolume",
	"/kibotos.ctrl.v1.TemplateService/ListTemplates",
	"/kibotos.ctrl.v1.SessionService/IssueSession",
	"/kibotos.admin.v1.AdminService/CreateToken",
	"/kibotos.host.v1.HostService/RegisterHost",
}

// FuzzAPI posts fuzzed bodies, in the Connect protocol's JSON and binary
// codecs, to methods of the real control plane: every answer is a success
// whose body decodes as the method's response, or a canonical Connect
// error that blames the request; never a 5xx (a handler's panic is one).
func FuzzAPI(f *testing.F) {
	srv := ctrltest.Start(f)
	for _, seed := range []struct {
		procedure int
		json      bool
		body      string
	}{
		{0, true, `{"command":{"commandId":"c1"},"spec":{"socks5":{"address":"proxy.example:1080"}},"labels":{"team":"net"}}`},
		{0, true, `{"spec":{"socks5":{"address":"10.0.0.1:1080"}}}`},
		{1, true, `{"pageSize":2,"labelSelector":{"team":"net"},"pageToken":"AAAA"}`},
		{2, true, `{"egressId":"egr_x","expectedLabelsRevision":"1","labels":{"a":"b"}}`},
		{3, true, `{"spec":{"udp":{"address":"9.9.9.9:53"}}}`},
		{4, true, `{"spec":{"memoryBytes":"1","cpuMillis":1,"templateId":"base"}}`},
		{5, true, `{"workspaceId":"ws_x","policy":{"mode":"NETWORK_MODE_PUBLIC_INTERNET","allow":["10.0.0.0/8"]}}`},
		{6, true, `{"spec":{"capacityBytes":"1152921504606846976"}}`},
		{7, true, `{"pageToken":"%%%"}`},
		{8, true, `{"workspaceId":"ws_x","ttlSeconds":1}`},
		{9, true, `{"role":99,"name":"x"}`},
		{10, true, `{"hostId":"h1"}`},
		{0, false, "\x0a\x04\x0a\x02c1\x12\x00"},
		{1, false, "\x08\xff\xff\xff\xff\x0f"},
		{4, false, "\x12\x80\x80\x80\x80\x10"},
		{9, false, "\x08\x63"},
		{0, true, `{"command":`},
		{3, true, `[1,2,3]`},
		{2, true, `{"labels":{"\u0000":"x"}}`},
	} {
		f.Add(uint8(seed.procedure), seed.json, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, which uint8, json bool, body []byte) {
		procedure := fuzzedProcedures[int(which)%len(fuzzedProcedures)]
		req := httptest.NewRequest(http.MethodPost, procedure, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/proto")
		if json {
			req.Header.Set("Content-Type", "application/json")
		}
		token := srv.AdminToken
		if strings.HasPrefix(procedure, "/kibotos.host.") {
			token = ctrltest.HostToken
		}
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		srv.Control.Handler.ServeHTTP(rec, req)

		if rec.Code == http.StatusOK {
			if err := decodeResponse(procedure, json, rec.Body.Bytes()); err != nil {
				t.Fatalf("%s %q: 200 with a body that is no response: %v", procedure, body, err)
			}
			return
		}
		if _, err := ctrltest.CheckUnaryRefusal(rec.Code, rec.Body.Bytes()); err != nil {
			t.Fatalf("%s %q: %v", procedure, body, err)
		}
	})
}

// decodeResponse decodes body as the response of procedure.
func decodeResponse(procedure string, json bool, body []byte) error {
	service, method, _ := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return err
	}
	out := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method)).Output()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(out.FullName())
	if err != nil {
		return err
	}
	m := mt.New().Interface()
	if json {
		return protojson.Unmarshal(body, m)
	}
	return proto.Unmarshal(body, m)
}
