package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestAnsweredCommandsSurviveKill sends a burst of CreateEgress commands
// from 64 callers to `kibotos up` (SQLite, where concurrent commands share
// one commit) and kills it with SIGKILL in the middle of the burst. After a
// restart every command answered before the kill is in the store, and its
// replay returns the answer's bytes.
func TestAnsweredCommandsSurviveKill(t *testing.T) {
	hosttest.RequireRoot(t)
	bin := build(t)
	home := filepath.Join(t.TempDir(), "home")
	up := startUp(t, bin, home)
	secret := adminToken(t, home)
	const procedure = "/kibotos.ctrl.v1.EgressService/CreateEgress"
	post := func(addr string, body []byte) (int, []byte, error) {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+procedure, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Content-Type", "application/proto")
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	request := func(caller, n int) []byte {
		b, err := proto.Marshal(&ctrlv1.CreateEgressRequest{
			Command: &ctrlv1.CommandMetadata{CommandId: fmt.Sprintf("burst-%d-%d", caller, n)},
			Spec:    &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "93.184.216.34:1080"}}},
			Labels:  map[string]string{"caller": fmt.Sprint(caller)},
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	type answer struct{ request, response []byte }
	var (
		mu       sync.Mutex
		answered []answer
		wg       sync.WaitGroup
		enough   = make(chan struct{})
		once     sync.Once
	)
	for caller := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				body := request(caller, n)
				status, resp, err := post(up.addr, body)
				if err != nil {
					return // the server is gone
				}
				if status != http.StatusOK {
					t.Errorf("CreateEgress: %d %s", status, resp)
					return
				}
				mu.Lock()
				answered = append(answered, answer{body, resp})
				if len(answered) == 300 {
					once.Do(func() { close(enough) })
				}
				mu.Unlock()
			}
		}()
	}
	select {
	case <-enough:
	case <-time.After(60 * time.Second):
		t.Fatal("the burst did not get 300 answers within 60 s")
	}
	up.kill()
	wg.Wait()
	t.Logf("%d commands answered before the kill", len(answered))

	up = startUp(t, bin, home)
	for _, a := range answered {
		status, again, err := post(up.addr, a.request)
		if err != nil || status != http.StatusOK || !bytes.Equal(again, a.response) {
			t.Fatalf("replay after restart: %d %v; differs from the answer before the kill", status, err)
		}
	}
	// Every answered Egress is stored, not only its command record.
	var list ctrlv1.ListEgressesResponse
	ids := map[string]bool{}
	for token := ""; ; {
		b, err := proto.Marshal(&ctrlv1.ListEgressesRequest{PageSize: 1000, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+up.addr+"/kibotos.ctrl.v1.EgressService/ListEgresses", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/proto")
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := proto.Unmarshal(body, &list); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Egresses {
			ids[e.EgressId] = true
		}
		if token = list.NextPageToken; token == "" {
			break
		}
	}
	for _, a := range answered {
		var created ctrlv1.CreateEgressResponse
		if err := proto.Unmarshal(a.response, &created); err != nil {
			t.Fatal(err)
		}
		if !ids[created.Egress.EgressId] {
			t.Errorf("egress %s was answered before the kill and is missing after the restart", created.Egress.EgressId)
		}
	}
}
