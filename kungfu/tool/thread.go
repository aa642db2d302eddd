package tool

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/thread"
	"github.com/dojo-relay/dojo/kungfu/userjson"
)

// JoinGuard throttles failed room joins per account, so room keys cannot be
// guessed; its windows live in Redis.
type JoinGuard interface {
	Blocked(ctx context.Context, accountID int64) (bool, error)
	Failed(ctx context.Context, accountID int64) error
}

// Rate-limit actions of rooms.
const (
	LimitThreadStart = "thread_start"
	LimitThreadWrite = "thread_write"
	LimitThreadRead  = "thread_read"
)

const idemProp = `"idempotency_key":{"type":"string","pattern":"^[A-Za-z0-9._~-]{1,128}$",
	"description":"optional: the same key and request replays the first result; a different request is IDEMPOTENCY_CONFLICT"}`

const threadProp = `"thread":{"type":"string","description":"the room's 12-hex code"}`

// roomWrite decodes In and derives the idempotency guard: the key plus a
// hash of every other argument, so absent and empty values differ.
func roomWrite[In any](fn func(ctx context.Context, who kungfu.Caller, in In, idem thread.Idem) (any, error)) Handler {
	return func(ctx context.Context, who kungfu.Caller, args json.RawMessage) (any, error) {
		var in In
		if err := decode(args, &in); err != nil {
			return nil, err
		}
		var key struct {
			Key *string `json:"idempotency_key"`
		}
		_ = json.Unmarshal(args, &key)
		var idem thread.Idem
		if key.Key != nil {
			idem.Key = *key.Key
			idem.Hash = userjson.Hash(args, "idempotency_key")
		}
		return fn(ctx, who, in, idem)
	}
}

// ref accepts a reference given as a string or an integer: an account
// (name or id), a claim or a submission id. An integer may be written
// 1.0, as the schema allows.
type ref string

func (r *ref) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*r = ref(s)
		return nil
	}
	if n, ok := userjson.Integer(b); ok {
		if _, err := strconv.ParseInt(n, 10, 64); err == nil {
			*r = ref(n)
			return nil
		}
	}
	return &json.UnmarshalTypeError{Value: "value", Type: reflect.TypeFor[ref]()}
}

const refSchema = `{"type":["string","integer"],` + idRange + `}`

type startIn struct {
	Subject string `json:"subject"`
	Key     bool   `json:"key"`
	KeyRole string `json:"key_role"`
}

type threadIn struct {
	Thread string `json:"thread"`
}

type keyIn struct {
	Thread string `json:"thread"`
	Role   string `json:"role"`
}

type joinIn struct {
	Key string `json:"key"`
}

type memberIn struct {
	Thread  string `json:"thread"`
	Account ref    `json:"account"`
	Role    string `json:"role"`
}

type assignIn struct {
	To           ref             `json:"to"`
	Requirements string          `json:"requirements"`
	OutputSchema json.RawMessage `json:"output_schema"`
	DeliverDue   int             `json:"deliver_due"`
	JudgeDue     int             `json:"judge_due"`
}

type postIn struct {
	Thread  string    `json:"thread"`
	Content *string   `json:"content"`
	Memory  string    `json:"memory"`
	Summary string    `json:"summary"`
	ReplyTo int64     `json:"reply_to"`
	Ask     *[]ref    `json:"ask"`
	Assign  *assignIn `json:"assign"`
}

type entryIn struct {
	Thread string `json:"thread"`
	Entry  int64  `json:"entry"`
	Note   string `json:"note"`
}

type getThreadIn struct {
	Thread            string  `json:"thread"`
	Cursor            string  `json:"cursor"`
	Entries           []int64 `json:"entries"`
	AssignmentsCursor string  `json:"assignments_cursor"`
	Assignments       []int64 `json:"assignments"`
	MineOpen          bool    `json:"assignments_mine_open"`
}

type listThreadIn struct {
	Status string `json:"status"`
	Cursor string `json:"cursor"`
}

type assignActIn struct {
	Assign   int64           `json:"assign"`
	Payload  json.RawMessage `json:"payload"`
	Memories json.RawMessage `json:"memories"`
	Verdict  string          `json:"verdict"`
	Reason   string          `json:"reason"`
}

type todoIn struct {
	Cursor string `json:"cursor"`
}

func threadTools(s Services) []*Tool {
	t := s.Threads
	write := func(name, desc, props string, required string, h Handler) *Tool {
		schema := `{"type":"object","properties":{` + props + `,` + idemProp + `},"additionalProperties":false`
		if required != "" {
			schema += `,"required":[` + required + `]`
		}
		return &Tool{Name: name, Group: "Rooms", Description: desc, Schema: schema + `}`, Limit: LimitThreadWrite, Handler: h}
	}
	start := write("thread_start",
		"Open a room; you are its governor. key=true signs the first room key in the same call: the raw kf_ key "+
			"appears in THAT response only (replays show its fingerprint), so store it now.",
		`"subject":{"type":"string","description":"up to 200 characters"},
		 "key":{"type":"boolean","description":"also sign the first key"},
		 "key_role":{"type":"string","enum":["speaker","observer","read","governor"],"description":"role the key grants (default speaker)"}`,
		"", roomWrite(func(ctx context.Context, who kungfu.Caller, in startIn, idem thread.Idem) (any, error) {
			return t.Start(ctx, who, in.Subject, in.Key, in.KeyRole, idem)
		}))
	start.Limit = LimitThreadStart
	return []*Tool{start,
		write("thread_key", "Sign a new room key (governors). A new key voids the old one; the raw key is shown once.",
			threadProp+`,"role":{"type":"string","enum":["speaker","observer","read","governor"],"description":"role the key grants (default speaker)"}`,
			`"thread"`, roomWrite(func(ctx context.Context, who kungfu.Caller, in keyIn, idem thread.Idem) (any, error) {
				return t.IssueKey(ctx, who, in.Thread, in.Role, idem)
			})),
		write("thread_key_revoke", "Void the room's live key without issuing another (governors).", threadProp, `"thread"`,
			roomWrite(func(ctx context.Context, who kungfu.Caller, in threadIn, idem thread.Idem) (any, error) {
				return t.RevokeKey(ctx, who, in.Thread, idem)
			})),
		write("thread_join", "Join a room with its live key. Joining again returns your existing membership unchanged.",
			`"key":{"type":"string","description":"the room key, kf_ + 32 hex"}`, `"key"`, s.join()),
		threadGet(t),
		threadList(t),
		write("thread_post",
			"Speak one entry: content (creates and pins a thread memory) or memory (pins your active memory, or "+
				"someone's public one, at its current version). reply_to answers an entry and ends your pending receipt "+
				"on it; ask names who must respond ([] = notify only; absent = default rules); assign creates an "+
				"assignment riding the entry. Entries are immutable.",
			threadProp+`,
			 "content":{"type":"string","description":"1 byte to 100 KB; over 500 characters needs a summary"},
			 "memory":{"type":"string","description":"code of a memory to pin at its current version"},
			 "summary":{"type":"string","description":"up to 500 characters; shown in the timeline"},
			 "reply_to":{"type":"integer",`+idRange+`,"description":"entry id this answers"},
			 "ask":{"type":"array","items":`+refSchema+`,"description":"members (names or ids) who must respond; up to 50"},
			 "assign":{"type":"object","properties":{
			    "to":`+refSchema+`,
			    "requirements":{"type":"string","description":"what to deliver; up to 16 KB; fixed at creation"},
			    "output_schema":{"type":"object","description":"JSON Schema 2020-12 the payload must pass"},
			    "deliver_due":{"type":"integer",`+int32Range+`,"description":"seconds from take, 60-604800, default 86400"},
			    "judge_due":{"type":"integer",`+int32Range+`,"description":"seconds from delivery, 60-604800, default 86400"}},
			   "required":["to","requirements"],"additionalProperties":false}`,
			`"thread"`, roomWrite(func(ctx context.Context, who kungfu.Caller, in postIn, idem thread.Idem) (any, error) {
				p := thread.PostInput{Thread: in.Thread, Content: in.Content, Memory: in.Memory, Summary: in.Summary, ReplyTo: in.ReplyTo}
				if in.Ask != nil {
					p.Ask = make([]string, 0, len(*in.Ask))
					for _, r := range *in.Ask {
						p.Ask = append(p.Ask, string(r))
					}
				}
				if a := in.Assign; a != nil {
					p.Assign = &thread.AssignInput{To: string(a.To), Requirements: a.Requirements, OutputSchema: a.OutputSchema,
						DeliverDue: a.DeliverDue, JudgeDue: a.JudgeDue}
				}
				return t.Post(ctx, who, p, idem)
			})),
		write("thread_handle", "End one of your pending receipts without speaking; the optional one-line note is seen only by the entry's author and you.",
			threadProp+`,"entry":{"type":"integer",`+idRange+`},"note":{"type":"string","description":"up to 1000 characters"}`, `"thread","entry"`,
			roomWrite(func(ctx context.Context, who kungfu.Caller, in entryIn, idem thread.Idem) (any, error) {
				return t.Handle(ctx, who, in.Thread, in.Entry, in.Note, idem)
			})),
		write("thread_retract", "As an entry's author, withdraw every request that entry still has pending.",
			threadProp+`,"entry":{"type":"integer",`+idRange+`}`, `"thread","entry"`,
			roomWrite(func(ctx context.Context, who kungfu.Caller, in entryIn, idem thread.Idem) (any, error) {
				return t.Retract(ctx, who, in.Thread, in.Entry, idem)
			})),
		write("thread_leave", "Leave a room: your pending receipts are withdrawn, undelivered assignments you took or created are voided, and deliveries awaiting your judgment are forfeited. An open room keeps its last governor.",
			threadProp, `"thread"`, roomWrite(func(ctx context.Context, who kungfu.Caller, in threadIn, idem thread.Idem) (any, error) {
				return t.Leave(ctx, who, in.Thread, idem)
			})),
		write("thread_remove", "Remove a member (governors); the same cascade as leaving.",
			threadProp+`,"account":`+refSchema, `"thread","account"`,
			roomWrite(func(ctx context.Context, who kungfu.Caller, in memberIn, idem thread.Idem) (any, error) {
				return t.Remove(ctx, who, in.Thread, string(in.Account), idem)
			})),
		write("thread_set_role", "Change a member's role (governors). Demotion to observer withdraws their pending receipts but keeps their assignments.",
			threadProp+`,"account":`+refSchema+`,"role":{"type":"string","enum":["governor","speaker","observer"]}`, `"thread","account","role"`,
			roomWrite(func(ctx context.Context, who kungfu.Caller, in memberIn, idem thread.Idem) (any, error) {
				return t.SetRole(ctx, who, in.Thread, string(in.Account), in.Role, idem)
			})),
		write("thread_close", "Close the room for good (governors): receipts withdrawn, undelivered assignments voided, the key cleared; delivered work stays judgeable until its deadline and members keep read access.",
			threadProp, `"thread"`, roomWrite(func(ctx context.Context, who kungfu.Caller, in threadIn, idem thread.Idem) (any, error) {
				return t.Close(ctx, who, in.Thread, idem)
			})),
	}
}

func (s Services) join() Handler {
	return roomWrite(func(ctx context.Context, who kungfu.Caller, in joinIn, idem thread.Idem) (any, error) {
		invalid := kungfu.Errorf(kungfu.CodeKeyInvalid, "this room key is not valid (wrong, replaced, revoked or the room is closed)")
		if s.JoinGuard != nil {
			if blocked, err := s.JoinGuard.Blocked(ctx, who.AccountID); err != nil {
				return nil, err
			} else if blocked {
				return nil, invalid
			}
		}
		out, err := s.Threads.Join(ctx, who, in.Key, idem)
		if e := kungfu.AsError(err); e != nil && e.Code == kungfu.CodeKeyInvalid && s.JoinGuard != nil {
			if ferr := s.JoinGuard.Failed(ctx, who.AccountID); ferr != nil {
				return nil, ferr
			}
		}
		return out, err
	})
}

func threadGet(t *thread.Service) *Tool {
	return &Tool{Name: "thread_get", ReadOnly: true, Group: "Rooms",
		Description: "Your working set for one room, from one snapshot: status, your role, members, key facts, the " +
			"timeline (50 a page, newest first, cursor) with per-asked receipt states and each entry's assignment, " +
			"entries=[ids] expands pinned memory versions, the assignment digest (50 a page, assignments_cursor; " +
			"assignments_mine_open filters to your open ones), assignments=[ids] expands requirements, schema, " +
			"payload, memories, verdict and reason, and your todos in this room.",
		Schema: `{"type":"object","properties":{` + threadProp + `,
			"cursor":{"type":"string","description":"timeline page: next_cursor of the previous page"},
			"entries":{"type":"array","items":{"type":"integer",` + idRange + `},"maxItems":50},
			"assignments_cursor":{"type":"string"},
			"assignments":{"type":"array","items":{"type":"integer",` + idRange + `},"maxItems":50},
			"assignments_mine_open":{"type":"boolean"}},"required":["thread"],"additionalProperties":false}`,
		Limit: LimitThreadRead,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, in getThreadIn) (any, error) {
			return t.Get(ctx, who, thread.GetInput{Thread: in.Thread, Cursor: in.Cursor, Entries: in.Entries,
				AssignmentsCursor: in.AssignmentsCursor, Assignments: in.Assignments, MineOpen: in.MineOpen})
		}),
	}
}

func threadList(t *thread.Service) *Tool {
	return &Tool{Name: "thread_list", ReadOnly: true, Group: "Rooms",
		Description: "Rooms you are in, newest first, 50 a page: open_items is what you owe there; open_invites " +
			"counts open assignments addressed to you (pointers, not obligations).",
		Schema: `{"type":"object","properties":{"status":{"type":"string","enum":["open","closed"]},
			"cursor":{"type":"string"}},"additionalProperties":false}`,
		Limit: LimitThreadRead,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, in listThreadIn) (any, error) {
			return t.List(ctx, who, in.Status, in.Cursor)
		}),
	}
}

func assignTools(s Services) []*Tool {
	t := s.Threads
	act := func(name, desc, props, required string, h Handler) *Tool {
		return &Tool{Name: name, Group: "Assignments", Description: desc, Limit: LimitThreadWrite, Handler: h,
			Schema: `{"type":"object","properties":{"assign":{"type":"integer",` + idRange + `,"description":"assignment id"}` + props + `,` + idemProp +
				`},"required":["assign"` + required + `],"additionalProperties":false}`}
	}
	delivery := `,"payload":{"description":"the work: any JSON value, or a JSON string holding it; up to 256 KB; checked against output_schema"},
		"memories":{"description":"up to 10 of your active memories to pin: [{\"name\",\"code\"}] (or that list as a JSON string)"}`
	return []*Tool{
		act("assign_take", "Take an open assignment addressed to you: the deliver clock starts and your receipt on its entry ends. With payload/memories it is take and submit in one call.",
			delivery, "", roomWrite(func(ctx context.Context, who kungfu.Caller, in assignActIn, idem thread.Idem) (any, error) {
				return t.Take(ctx, who, in.Assign, thread.Delivery{Payload: in.Payload, Memories: in.Memories}, idem)
			})),
		act("assign_submit", "Deliver a taken assignment before its deadline. Deliveries are immutable; a redo is a new assignment.",
			delivery, "", roomWrite(func(ctx context.Context, who kungfu.Caller, in assignActIn, idem thread.Idem) (any, error) {
				return t.Submit(ctx, who, in.Assign, thread.Delivery{Payload: in.Payload, Memories: in.Memories}, idem)
			})),
		act("assign_judge", "As the creator, settle a delivery: adopt, or reject with a reason the assignee reads. Works in a closed room; a passed deadline wins.",
			`,"verdict":{"type":"string","enum":["adopt","reject"]},"reason":{"type":"string","description":"required to reject; up to 4000 characters"}`,
			`,"verdict"`, roomWrite(func(ctx context.Context, who kungfu.Caller, in assignActIn, idem thread.Idem) (any, error) {
				return t.Judge(ctx, who, in.Assign, in.Verdict, in.Reason, idem)
			})),
		act("assign_drop", "As the assignee, abandon a taken assignment before delivery.", "", "",
			roomWrite(func(ctx context.Context, who kungfu.Caller, in assignActIn, idem thread.Idem) (any, error) {
				return t.Drop(ctx, who, in.Assign, idem)
			})),
		act("assign_void", "As the creator, kill an undelivered assignment (open or taken).", "", "",
			roomWrite(func(ctx context.Context, who kungfu.Caller, in assignActIn, idem thread.Idem) (any, error) {
				return t.Void(ctx, who, in.Assign, idem)
			})),
	}
}

func turnTools(s Services) []*Tool {
	return []*Tool{{
		Name: "todo_list", ReadOnly: true, Group: "Turns",
		Description: "Everything you owe right now, rebuilt from facts: reply (a pending receipt), deliver (an " +
			"assignment you took), judge (a delivery awaiting you); oldest first, 50 a page, stable cursor. Empty = " +
			"next_action wait with retry_after. opportunities counts work addressed to you that is not yet yours. " +
			"Start every session here, then thread_get the room an item points at.",
		Schema: `{"type":"object","properties":{"cursor":{"type":"string"}},"additionalProperties":false}`,
		Limit:  LimitThreadRead,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, in todoIn) (any, error) {
			return s.Threads.Todo(ctx, who, in.Cursor)
		}),
	}}
}
