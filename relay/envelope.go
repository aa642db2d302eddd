package relay

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/tool"
)

type codeInfo struct {
	status     int
	nextAction string
}

// errorTable is the one place that maps a protocol error code to its HTTP
// status and next_action. A code missing here is masked as INTERNAL_ERROR.
var errorTable = map[string]codeInfo{
	kungfu.CodeUnauthorized:        {http.StatusUnauthorized, "stop"},
	kungfu.CodeInvalidCredentials:  {http.StatusUnauthorized, "stop"},
	kungfu.CodeInsufficientCredits: {http.StatusPaymentRequired, ""},
	kungfu.CodeNotOwner:            {http.StatusForbidden, ""},
	kungfu.CodePrivateKungfu:       {http.StatusForbidden, ""},
	kungfu.CodeNotFound:            {http.StatusNotFound, ""},
	kungfu.CodeUnknownTool:         {http.StatusNotFound, ""},
	kungfu.CodeNameTaken:           {http.StatusConflict, ""},
	kungfu.CodeInvalidState:        {http.StatusConflict, ""},
	kungfu.CodeIdempotencyConflict: {http.StatusConflict, "revise"},
	kungfu.CodePayloadTooLarge:     {http.StatusRequestEntityTooLarge, "revise"},
	kungfu.CodeContentTooLarge:     {http.StatusRequestEntityTooLarge, "revise"},
	kungfu.CodeValidationFailed:    {http.StatusUnprocessableEntity, ""},
	kungfu.CodeInvalidName:         {http.StatusUnprocessableEntity, ""},
	kungfu.CodeInvalidPassword:     {http.StatusUnprocessableEntity, ""},
	kungfu.CodeReservedName:        {http.StatusUnprocessableEntity, ""},
	kungfu.CodeInvalidCode:         {http.StatusUnprocessableEntity, ""},
	kungfu.CodeContentTooShort:     {http.StatusUnprocessableEntity, ""},
	kungfu.CodeTitleTooLong:        {http.StatusUnprocessableEntity, ""},
	kungfu.CodeDescriptionTooLong:  {http.StatusUnprocessableEntity, ""},
	kungfu.CodeTooManyTags:         {http.StatusUnprocessableEntity, ""},
	kungfu.CodeTagTooLong:          {http.StatusUnprocessableEntity, ""},
	kungfu.CodeInvalidTags:         {http.StatusUnprocessableEntity, ""},
	kungfu.CodeSensitiveContent:    {http.StatusUnprocessableEntity, "revise"},
	kungfu.CodeMissingField:        {http.StatusBadRequest, ""},
	kungfu.CodeInvalidRequest:      {http.StatusBadRequest, ""},
	kungfu.CodeRateLimit:           {http.StatusTooManyRequests, "wait"},
	kungfu.CodeInternal:            {http.StatusInternalServerError, ""},

	kungfu.CodeThreadNotFound:  {http.StatusNotFound, "stop"},
	kungfu.CodeAssignNotFound:  {http.StatusNotFound, "stop"},
	kungfu.CodeNotMember:       {http.StatusForbidden, "stop"},
	kungfu.CodeNotGovernor:     {http.StatusForbidden, "retry"},
	kungfu.CodeReadOnly:        {http.StatusForbidden, "stop"},
	kungfu.CodeNotYours:        {http.StatusForbidden, "stop"},
	kungfu.CodeKeyInvalid:      {http.StatusUnauthorized, "stop"},
	kungfu.CodeThreadClosed:    {http.StatusConflict, "stop"},
	kungfu.CodeRoomLimit:       {http.StatusConflict, "stop"},
	kungfu.CodeMemberLimit:     {http.StatusConflict, "stop"},
	kungfu.CodeLastManager:     {http.StatusConflict, "retry"},
	kungfu.CodeInvalidTarget:   {http.StatusUnprocessableEntity, "retry"},
	kungfu.CodeSummaryRequired: {http.StatusUnprocessableEntity, "revise"},
	kungfu.CodeSchemaMismatch:  {http.StatusUnprocessableEntity, "revise"},

	kungfu.CodeTaskNotFound:        {http.StatusNotFound, "stop"},
	kungfu.CodeSubmissionNotFound:  {http.StatusNotFound, ""},
	kungfu.CodeHarnessRefNotFound:  {http.StatusNotFound, ""},
	kungfu.CodeTaskNotOpen:         {http.StatusConflict, "stop"},
	kungfu.CodeSlotsExhausted:      {http.StatusConflict, "stop"},
	kungfu.CodeSubmissionLimit:     {http.StatusConflict, "wait"},
	kungfu.CodeClaimRequired:       {http.StatusConflict, "retry"},
	kungfu.CodeClaimInvalid:        {http.StatusConflict, "retry"},
	kungfu.CodeHasReservations:     {http.StatusConflict, ""},
	kungfu.CodeNothingToRefund:     {http.StatusConflict, ""},
	kungfu.CodeOwnTask:             {http.StatusForbidden, "stop"},
	kungfu.CodeCredentialInPayload: {http.StatusUnprocessableEntity, "revise"},
	kungfu.CodeInvalidRevises:      {http.StatusUnprocessableEntity, "revise"},
	kungfu.CodeInvalidRequestKey:   {http.StatusUnprocessableEntity, "revise"},
}

// statusOf returns the HTTP status for a refusal code.
func statusOf(code string) int {
	if c, ok := errorTable[code]; ok {
		return c.status
	}
	return http.StatusInternalServerError
}

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details any    `json:"details"`
}

type head struct {
	OK         bool       `json:"ok"`
	Error      *errorBody `json:"error"`
	NextAction *string    `json:"next_action"`
	Next       []any      `json:"next"`
	RetryAfter *int       `json:"retry_after"`
	APIVersion string     `json:"api_version"`
}

// envelope is one rendered result: the JSON bytes and the HTTP status that
// goes with them.
type envelope struct {
	body   []byte
	status int
	ok     bool
}

// success renders the envelope head followed by the tool's own fields, in
// that order, so agents read ok/error first.
func success(result any) (envelope, error) {
	h := head{OK: true, Next: []any{}, APIVersion: kungfu.Version}
	if a, ok := result.(tool.Advisor); ok {
		na, ra := a.Advice()
		if na != "" {
			h.NextAction = &na
		}
		h.RetryAfter = ra
	}
	body, err := splice(h, result)
	return envelope{body: body, status: http.StatusOK, ok: true}, err
}

// refusal renders a not-accepted envelope for e.
func refusal(e *kungfu.Error) envelope {
	info, known := errorTable[e.Code]
	if !known {
		e = &kungfu.Error{Code: kungfu.CodeInternal, Message: "internal error"}
		info = errorTable[kungfu.CodeInternal]
	}
	h := head{OK: false, Next: []any{}, APIVersion: kungfu.Version, RetryAfter: e.RetryAfter,
		Error: &errorBody{Code: e.Code, Message: e.Message, Details: e.Details}}
	if info.nextAction != "" {
		na := info.nextAction
		h.NextAction = &na
	}
	body, err := splice(h, nil)
	if err != nil {
		body = []byte(`{"ok":false,"error":{"code":"INTERNAL_ERROR","message":"internal error","details":null}}`)
	}
	return envelope{body: body, status: info.status}
}

func splice(h head, result any) ([]byte, error) {
	hb, err := marshal(h)
	if err != nil {
		return nil, err
	}
	if result == nil {
		return hb, nil
	}
	rb, err := marshal(result)
	if err != nil {
		return nil, err
	}
	if len(rb) < 2 || rb[0] != '{' {
		return nil, &json.UnsupportedValueError{Str: "tool result is not an object"}
	}
	if string(rb) == "{}" {
		return hb, nil
	}
	var buf bytes.Buffer
	buf.Grow(len(hb) + len(rb))
	buf.Write(hb[:len(hb)-1])
	buf.WriteByte(',')
	buf.Write(rb[1:])
	return buf.Bytes(), nil
}

// marshal is json.Marshal without HTML escaping: agents read these bodies,
// browsers do not render them.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(buf.Bytes()), nil
}
