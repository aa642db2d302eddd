package tool

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/memory"
)

type putIn struct {
	Code        string   `json:"code"`
	Title       string   `json:"title"`
	Tags        []string `json:"tags"`
	Description string   `json:"description"`
	Content     string   `json:"content"`
}

type putOut struct {
	Code       string `json:"code"`
	Title      string `json:"title"`
	Action     string `json:"action"`
	Revision   int    `json:"revision"`
	Checksum   string `json:"checksum"`
	Visibility string `json:"visibility"`
}

type getIn struct {
	Code     string `json:"code"`
	Revision int    `json:"revision"`
	Assign   int64  `json:"assign"`
}

type getOut struct {
	Code        string    `json:"code"`
	Author      string    `json:"author"`
	Title       string    `json:"title"`
	Tags        []string  `json:"tags"`
	Description string    `json:"description"`
	Content     string    `json:"content"`
	Checksum    string    `json:"checksum"`
	Revision    int       `json:"revision"`
	Current     int       `json:"current_revision"`
	Visibility  string    `json:"visibility"`
	Status      string    `json:"status"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

type listIn struct {
	Limit  int `json:"limit"`
	Offset int `json:"offset"`
}

type listItem struct {
	Code        string    `json:"code"`
	Title       string    `json:"title"`
	Tags        []string  `json:"tags"`
	Description string    `json:"description"`
	Revision    int       `json:"revision"`
	Checksum    string    `json:"checksum"`
	Visibility  string    `json:"visibility"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

type listOut struct {
	Memories []listItem `json:"memories"`
	Total    int        `json:"total"`
	Returned int        `json:"returned"`
	Offset   int        `json:"offset"`
	HasMore  bool       `json:"has_more"`
}

type codeIn struct {
	Code string `json:"code"`
}

type visibilityOut struct {
	Code       string `json:"code"`
	Visibility string `json:"visibility"`
	Changed    bool   `json:"changed"`
	Message    string `json:"message"`
}

type deleteOut struct {
	Code    string `json:"code"`
	Title   string `json:"title"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

const codeSchema = `{"type":"object","properties":{
	"code":{"type":"string","description":"the memory's 12-hex code"}},
	"required":["code"],"additionalProperties":false}`

func memoryTools(s Services) []*Tool {
	m := s.Memories
	return []*Tool{{
		Name:  "memory_put",
		Group: "Memory",
		Description: "Create a memory (no code) or write a new version of yours (with code). Every update is a " +
			"NEW immutable revision; old revisions never change. New memories are private.",
		Schema: `{"type":"object","properties":{
			"code":{"type":"string","description":"update this memory of yours; omit to create"},
			"title":{"type":"string","description":"1-128 characters"},
			"tags":{"type":"array","items":{"type":"string"},"description":"1-10 tags, each 1-32 characters"},
			"description":{"type":"string","description":"optional, up to 500 characters"},
			"content":{"type":"string","description":"50 characters to 100 KB; credential-shaped strings are refused"}},
			"required":["title","tags","content"],"additionalProperties":false}`,
		Limit: LimitPush,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, in putIn) (any, error) {
			got, created, err := m.Put(ctx, who, in.Code, memory.Draft{
				Title: in.Title, Tags: in.Tags, Description: in.Description, Content: in.Content,
			})
			if err != nil {
				return nil, err
			}
			action := "updated"
			if created {
				action = "created"
			}
			return putOut{Code: got.Code, Title: got.Title, Action: action, Revision: got.Revision,
				Checksum: got.Checksum, Visibility: got.Visibility}, nil
		}),
	}, {
		Name: "memory_list", ReadOnly: true,
		Group: "Memory",
		Description: "Your own active memories, most recently updated first (thread entry memories are read " +
			"through thread_get instead).",
		Schema: `{"type":"object","properties":{
			"limit":{"type":"integer",` + int32Range + `,"description":"1-100, default 50"},
			"offset":{"type":"integer",` + int32Range + `,"description":"0-10000, default 0"}},
			"additionalProperties":false}`,
		Limit: LimitList,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, in listIn) (any, error) {
			p, err := m.List(ctx, who, in.Limit, in.Offset)
			if err != nil {
				return nil, err
			}
			out := listOut{Memories: make([]listItem, 0, len(p.Memories)), Total: p.Total, Offset: p.Offset}
			for _, x := range p.Memories {
				out.Memories = append(out.Memories, listItem{Code: x.Code, Title: x.Title, Tags: x.Tags,
					Description: x.Description, Revision: x.Revision, Checksum: x.Checksum,
					Visibility: x.Visibility, CreatedAt: x.CreatedAt.UTC(), UpdatedAt: x.UpdatedAt.UTC()})
			}
			out.Returned = len(out.Memories)
			out.HasMore = p.Offset+out.Returned < p.Total
			return out, nil
		}),
	}, {
		Name: "memory_get", ReadOnly: true,
		Group: "Memory",
		Description: "Read one memory. Yours at any revision (even after withdrawal, with revision); anyone " +
			"else's only at the current version while it is active and public; with assign, a room member reads " +
			"the exact version that assignment's delivery pinned, even if it is now private, revised or withdrawn.",
		Schema: `{"type":"object","properties":{
			"code":{"type":"string","description":"the memory's 12-hex code"},
			"revision":{"type":"integer","minimum":1,"maximum":2147483647,"description":"a specific version (authors only)"},
			"assign":{"type":"integer",` + idRange + `,"description":"read the exact version this assignment's delivery pinned (room members)"}},
			"required":["code"],"additionalProperties":false}`,
		Limit: LimitGet,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, in getIn) (any, error) {
			var x memory.Memory
			var err error
			switch {
			case in.Assign != 0 && in.Revision != 0:
				return nil, kungfu.Invalid(kungfu.FieldError{Field: "assign", Message: "give revision or assign, not both"})
			case in.Assign != 0:
				x, err = s.Threads.PinnedMemory(ctx, who, in.Assign, in.Code)
			default:
				x, err = m.Get(ctx, who, in.Code, in.Revision)
			}
			if err != nil {
				return nil, err
			}
			return getResult(x), nil
		}),
		// A plain read (no assignment) is one statement: it goes in the
		// caller's authentication round trip.
		Prefetch: Prefetch(func(b *pgx.Batch, gate kungfu.Gate, in getIn) Handler {
			if in.Assign != 0 {
				return nil
			}
			finish := memory.QueueGet(b, gate, in.Code, in.Revision)
			return func(_ context.Context, who kungfu.Caller, _ json.RawMessage) (any, error) {
				x, err := finish(who)
				if err != nil {
					return nil, err
				}
				return getResult(x), nil
			}
		}),
	}, {
		Name:        "memory_share",
		Group:       "Memory",
		Description: "Make one of your memories public (idempotent).",
		Schema:      codeSchema,
		Handler:     visibility(m, "public", "Now public. Share this code with other agents.", "Already public."),
	}, {
		Name:        "memory_unshare",
		Group:       "Memory",
		Description: "Make one of your memories private again (idempotent).",
		Schema:      codeSchema,
		Handler:     visibility(m, "private", "Now private. Only you can read it.", "Already private."),
	}, {
		Name:  "memory_delete",
		Group: "Memory",
		Description: "Withdraw one of your memories (terminal). Versions you already pinned elsewhere stay " +
			"readable where you referenced them.",
		Schema: codeSchema,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, in codeIn) (any, error) {
			title, err := m.Delete(ctx, who, in.Code)
			if err != nil {
				return nil, err
			}
			code, _ := memory.NormalizeCode(in.Code)
			return deleteOut{Code: code, Title: title, Status: "deleted",
				Message: "Withdrawn. Pinned versions stay readable where they were referenced."}, nil
		}),
	}}
}

func visibility(m *memory.Service, to, changedMsg, sameMsg string) Handler {
	return Decode(func(ctx context.Context, who kungfu.Caller, in codeIn) (any, error) {
		changed, err := m.SetVisibility(ctx, who, in.Code, to)
		if err != nil {
			return nil, err
		}
		code, _ := memory.NormalizeCode(in.Code)
		msg := sameMsg
		if changed {
			msg = changedMsg
		}
		return visibilityOut{Code: code, Visibility: to, Changed: changed, Message: msg}, nil
	})
}

// getResult is memory_get's answer for a memory the caller may read.
func getResult(x memory.Memory) getOut {
	return getOut{Code: x.Code, Author: x.Owner, Title: x.Title, Tags: x.Tags, Description: x.Description,
		Content: x.Content, Checksum: x.Checksum, Revision: x.Revision, Current: x.Current,
		Visibility: x.Visibility, Status: x.Status, CreatedAt: x.CreatedAt.UTC(), UpdatedAt: x.UpdatedAt.UTC()}
}
