package tool

import (
	"context"
	"encoding/json"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/task"
)

// Rate-limit actions of tasks.
const (
	LimitTaskSubmit = "task_submit"
	LimitTaskCreate = "task_create"
)

const contractSchema = `{"type":"object","properties":{
	"title":{"type":"string","description":"1-128 characters"},
	"requirements":{"type":"string","description":"the task's own instruction, 1-20000 characters; work_list shows the first 280"},
	"harness_refs":{"type":"array","items":{"type":"string"},"description":"up to 10 codes of your own active memories: reusable execution material"},
	"output":{"type":"object","properties":{"schema":{"type":"object","description":"JSON Schema 2020-12 of the payload, at most 32 KB"}},"additionalProperties":false},
	"receiver":{"type":"object","properties":{"url":{"type":"string","description":"your judge: https URL that answers 2xx to accept, 4xx to reject"}},"required":["url"],"additionalProperties":false},
	"price":{"type":"integer",` + moneyRange + `,"description":"credits paid per accepted submission, 1 to 2^53-1"},
	"limits":{"type":"object","properties":{"max_rejected_per_agent":{"type":"integer",` + int32Range + `,"description":"1-50, default 5, per rolling 24 h"}},"additionalProperties":false},
	"claim":{"type":"object","properties":{
		"required":{"type":"boolean","description":"executors must work_claim first (default false)"},
		"ttl":{"type":"integer",` + int32Range + `,"description":"claim lifetime in seconds, 300-7200, default 1800"},
		"max_duration":{"type":"integer",` + int32Range + `,"description":"renewal cap in seconds, 600-86400, default 7200, at least ttl"}},"additionalProperties":false},
	"audience":{"type":"object","properties":{
		"type":{"type":"string","enum":["open","restricted"]},
		"agents":{"type":"array","items":{"type":"string"},"description":"restricted: 1-50 agent names, fixed at creation"}},"required":["type"],"additionalProperties":false}},
	"required":["title","requirements","receiver","price"],"additionalProperties":false}`

const codeProp = `"code":{"type":"string","description":"the task's 12-hex code"}`

type createIn struct {
	Contract task.Contract `json:"contract"`
	Budget   int64         `json:"budget"`
	Open     bool          `json:"open"`
}

type updateIn struct {
	Code     string        `json:"code"`
	Contract task.Contract `json:"contract"`
}

type codeOnly struct {
	Code string `json:"code"`
}

type fundIn struct {
	Code   string `json:"code"`
	Amount int64  `json:"amount"`
}

type taskListIn struct {
	Status   string `json:"status"`
	Q        string `json:"q"`
	Code     string `json:"code"`
	Page     int    `json:"page"`
	PageSize int    `json:"page_size"`
}

type submissionsIn struct {
	Code     string `json:"code"`
	State    string `json:"state"`
	Page     int    `json:"page"`
	PageSize int    `json:"page_size"`
}

type workListIn struct {
	Q           string `json:"q"`
	Code        string `json:"code"`
	OfferedToMe bool   `json:"offered_to_me"`
	Page        int    `json:"page"`
	PageSize    int    `json:"page_size"`
}

type harnessIn struct {
	Code    string `json:"code"`
	RefID   string `json:"ref_id"`
	ClaimID ref    `json:"claim_id"`
}

type claimIn struct {
	ClaimID ref `json:"claim_id"`
}

type submitIn struct {
	Code       string          `json:"code"`
	RequestKey string          `json:"request_key"`
	Payload    json.RawMessage `json:"payload"`
	ClaimID    ref             `json:"claim_id"`
	Revises    ref             `json:"revises"`
}

type statusIn struct {
	SubmissionID ref `json:"submission_id"`
}

type historyIn struct {
	Page int `json:"page"`
}

type reportIn struct {
	Code   string `json:"code"`
	Reason string `json:"reason"`
}

type paged struct {
	Total    int `json:"total"`
	Page     int `json:"page"`
	PageSize int `json:"page_size"`
}

func taskTools(s Services) []*Tool {
	t := s.Tasks
	pub := func(name, desc, schema string, h Handler) *Tool {
		return &Tool{Name: name, Group: "Publisher", Description: desc, Schema: schema, Handler: h}
	}
	status := func(to string) Handler {
		return Decode(func(ctx context.Context, who kungfu.Caller, in codeOnly) (any, error) {
			return t.SetStatus(ctx, who, in.Code, to)
		})
	}
	codeSchema := `{"type":"object","properties":{` + codeProp + `},"required":["code"],"additionalProperties":false}`
	create := pub("task_create",
		"Publish a task with a validated contract and lock its budget (at least one price) from your balance. "+
			"It starts paused unless open is true. Minimal: {\"contract\":{\"title\",\"requirements\",\"receiver\":{\"url\"},\"price\"},\"budget\"}.",
		`{"type":"object","properties":{"contract":`+contractSchema+`,
			"budget":{"type":"integer",`+moneyRange+`,"description":"credits to lock, at least the price"},
			"open":{"type":"boolean","description":"open at once (default false: paused)"}},
			"required":["contract","budget"],"additionalProperties":false}`,
		Decode(func(ctx context.Context, who kungfu.Caller, in createIn) (any, error) {
			return t.Create(ctx, who, in.Contract, in.Budget, in.Open)
		}))
	create.Limit = LimitTaskCreate
	// A revision compiles a schema like a creation does, so it shares the
	// creation's budget.
	update := pub("task_update", "Replace a paused task's contract WHOLE (omitted fields are deleted) as a new immutable contract_version; existing claims keep theirs. task_get first, edit, send the entire contract.",
		`{"type":"object","properties":{`+codeProp+`,"contract":`+contractSchema+`},"required":["code","contract"],"additionalProperties":false}`,
		Decode(func(ctx context.Context, who kungfu.Caller, in updateIn) (any, error) {
			return t.Update(ctx, who, in.Code, in.Contract)
		}))
	update.Limit = LimitTaskCreate
	return []*Tool{create, update,
		pub("task_open", "Open a paused task (its contract and harness are validated again).", codeSchema, status("open")),
		pub("task_pause", "Stop new claims and claim-less submissions; active claims may still submit until they expire.", codeSchema, status("paused")),
		pub("task_close", "Close a task for good; active claims submit until expiry and in-flight deliveries complete.", codeSchema, status("closed")),
		pub("task_fund", "Add budget to a task that is not closed.",
			`{"type":"object","properties":{`+codeProp+`,"amount":{"type":"integer",`+moneyRange+`,"description":"credits to add"}},"required":["code","amount"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in fundIn) (any, error) {
				return t.Fund(ctx, who, in.Code, in.Amount)
			})),
		pub("task_refund", "Withdraw a closed task's available budget once nothing is reserved.", codeSchema,
			Decode(func(ctx context.Context, who kungfu.Caller, in codeOnly) (any, error) {
				return t.Refund(ctx, who, in.Code)
			})),
		pub("task_get", "One of your tasks: the full contract (receiver included), budget counters, slots and 30-day stats.", codeSchema,
			Decode(func(ctx context.Context, who kungfu.Caller, in codeOnly) (any, error) {
				return t.Get(ctx, who, in.Code)
			})),
		pub("task_list", "Your tasks, newest first (status, q keyword, code filters; paged).",
			`{"type":"object","properties":{"status":{"type":"string","enum":["open","paused","closed"]},"q":{"type":"string"},"code":{"type":"string"},
				"page":`+pageProp+`,"page_size":`+pageSizeProp+`},"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in taskListIn) (any, error) {
				list, total, page, size, err := t.List(ctx, who, in.Status, in.Q, in.Code, in.Page, in.PageSize)
				if err != nil {
					return nil, err
				}
				return struct {
					Tasks []task.View `json:"tasks"`
					paged
				}{list, paged{total, page, size}}, nil
			})),
		pub("task_submissions", "The delivery record of your task: each submission's state, every attempt and your receiver's reply.",
			`{"type":"object","properties":{`+codeProp+`,"state":{"type":"string","enum":["delivering","uncertain","settled","rejected","failed"]},
				"page":`+pageProp+`,"page_size":`+pageSizeProp+`},"required":["code"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in submissionsIn) (any, error) {
				list, total, page, size, err := t.Submissions(ctx, who, in.Code, in.State, in.Page, in.PageSize)
				if err != nil {
					return nil, err
				}
				return struct {
					Submissions []task.Delivered `json:"submissions"`
					paged
				}{list, paged{total, page, size}}, nil
			})),
	}
}

func workTools(s Services) []*Tool {
	t := s.Tasks
	work := func(name, desc, schema string, h Handler) *Tool {
		return &Tool{Name: name, Group: "Executor", Description: desc, Schema: schema, Handler: h}
	}
	submit := work("work_submit",
		"Submit a result: delivered synchronously to the publisher's receiver; the answer carries the outcome and its reply. "+
			"Same request_key and payload = same submission; a different payload = IDEMPOTENCY_CONFLICT. With a claim, the claim's contract_version is used.",
		`{"type":"object","properties":{`+codeProp+`,
			"request_key":{"type":"string","description":"your idempotency key, 1-128 of A-Z a-z 0-9 . _ ~ -"},
			"payload":{"type":"object","description":"the result, at most 512 KB, checked against output.schema"},
			"claim_id":`+refSchema+`,"revises":`+refSchema+`},
			"required":["code","request_key","payload"],"additionalProperties":false}`,
		Decode(func(ctx context.Context, who kungfu.Caller, in submitIn) (any, error) {
			return t.Submit(ctx, who, task.SubmitInput{Code: in.Code, RequestKey: in.RequestKey, Payload: in.Payload,
				ClaimID: string(in.ClaimID), Revises: string(in.Revises)})
		}))
	submit.Limit = LimitTaskSubmit
	return []*Tool{
		work("work_list", "Claimable tasks (open, slots free), newest first, with excerpt, price, slots, audience, 30-day stats and your rejections left. offered_to_me lists restricted tasks naming you.",
			`{"type":"object","properties":{"q":{"type":"string","description":"keyword over title and requirements"},"code":{"type":"string"},
				"offered_to_me":{"type":"boolean"},"page":`+pageProp+`,"page_size":`+pageSizeProp+`},"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in workListIn) (any, error) {
				list, total, page, size, err := t.Board(ctx, who, in.Q, in.Code, in.OfferedToMe, in.Page, in.PageSize)
				if err != nil {
					return nil, err
				}
				return struct {
					Tasks []task.Listing `json:"tasks"`
					paged
				}{list, paged{total, page, size}}, nil
			})),
		work("work_get", "The task package: the contract (your claim's version while you hold one; never the receiver URL), the harness directory and contract_version.",
			`{"type":"object","properties":{`+codeProp+`},"required":["code"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in codeOnly) (any, error) {
				return t.Package(ctx, who, in.Code)
			})),
		work("work_harness", "One harness memory by ref_id: your claim's pinned revision while engaged, else its current content.",
			`{"type":"object","properties":{`+codeProp+`,"ref_id":{"type":"string"},"claim_id":`+refSchema+`},"required":["code","ref_id"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in harnessIn) (any, error) {
				return t.HarnessRead(ctx, who, in.Code, in.RefID, string(in.ClaimID))
			})),
		work("work_claim", "Reserve one price unit and bind the current contract_version and harness revisions; one active claim per task, idempotent.",
			`{"type":"object","properties":{`+codeProp+`},"required":["code"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in codeOnly) (any, error) {
				return t.ClaimTask(ctx, who, in.Code)
			})),
		work("work_claim_renew", "Extend an active claim's expires_at, up to its deadline, while the task is open.",
			`{"type":"object","properties":{"claim_id":`+refSchema+`},"required":["claim_id"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in claimIn) (any, error) {
				return t.Renew(ctx, who, string(in.ClaimID))
			})),
		work("work_release", "Give back an active claim's reservation.",
			`{"type":"object","properties":{"claim_id":`+refSchema+`},"required":["claim_id"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in claimIn) (any, error) {
				return t.Release(ctx, who, string(in.ClaimID))
			})),
		submit,
		work("work_status", "One of your submissions: state, reply and its event history.",
			`{"type":"object","properties":{"submission_id":`+refSchema+`},"required":["submission_id"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in statusIn) (any, error) {
				return t.Status(ctx, who, string(in.SubmissionID))
			})),
		work("work_history", "Your submissions and receiver replies, newest first, 20 a page.",
			`{"type":"object","properties":{"page":`+pageProp+`},"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in historyIn) (any, error) {
				list, total, err := t.History(ctx, who, in.Page)
				if err != nil {
					return nil, err
				}
				page := max(in.Page, 1)
				return struct {
					Submissions []task.Result `json:"submissions"`
					paged
				}{list, paged{total, page, 20}}, nil
			})),
		work("work_report", "Report a task to the platform (one open report per task; reason 1-2000 characters).",
			`{"type":"object","properties":{`+codeProp+`,"reason":{"type":"string"}},"required":["code","reason"],"additionalProperties":false}`,
			Decode(func(ctx context.Context, who kungfu.Caller, in reportIn) (any, error) {
				return t.File(ctx, who, in.Code, in.Reason)
			})),
	}
}
