//! One handler per endpoint: extract, call the [`crate::fleet::Fleet`] operation, answer JSON.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use timeshard_control_api::ClassSpec;
use timeshard_control_api::api::{
    ApiTokenInfo, AuditEntry, AuditQuery, Changed, CreateApiToken, CreateEnrollmentToken, CreateHttpToken, DeviceInfo,
    EnrollRequest, EnrollResponse, EnrollmentTokenInfo, FleetInfo, HttpTokenInfo, Issued, MAX_WATCH_WAIT_MS,
    PutClasses, PutNodeConfig, RenewRequest, Report, RevokeDevice, SetDeviceLocation, TokenCreated, WatchQuery,
};
use timeshard_control_api::state::NodeConfigEntry;

use timeshard_control_api::policy::{
    PolicyVersionInfo, RolloutAction, RolloutSpec, RolloutStatus, UploadQuery, Uploaded,
};

use super::AppState;
use super::extract::{Body, ModuleBody, PeerNode, Query};
use crate::error::Result;
use crate::fleet::rollouts::Action;
use crate::fleet::tokens::Caller;

/// How long a watch waits when the node does not say.
const DEFAULT_WATCH_WAIT: Duration = Duration::from_secs(30);

pub async fn health() -> &'static str {
    "ok\n"
}

pub async fn fleet(State(s): State<AppState>, caller: Caller) -> Result<Json<FleetInfo>> {
    Ok(Json(s.fleet.info(&caller).await?))
}

pub async fn enroll(State(s): State<AppState>, Body(req): Body<EnrollRequest>) -> Result<Json<EnrollResponse>> {
    Ok(Json(s.fleet.enroll(req).await?))
}

pub async fn renew(State(s): State<AppState>, peer: PeerNode, Body(req): Body<RenewRequest>) -> Result<Json<Issued>> {
    Ok(Json(s.fleet.renew(&peer.node_id, req).await?))
}

pub async fn report(State(s): State<AppState>, peer: PeerNode, Body(req): Body<Report>) -> Result<StatusCode> {
    s.fleet.report(&peer.node_id, req).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Long poll: the node's desired state once the generation passes `since`, or 304 after the wait.
pub async fn watch(State(s): State<AppState>, peer: PeerNode, Query(q): Query<WatchQuery>) -> Result<Response> {
    // Unknown and revoked devices are refused before they wait.
    s.fleet.device(&peer.node_id).await?;
    let wait = q.wait_ms.map(Duration::from_millis).unwrap_or(DEFAULT_WATCH_WAIT);
    let deadline = tokio::time::Instant::now() + wait.min(Duration::from_millis(MAX_WATCH_WAIT_MS));
    let mut changes = s.fleet.subscribe();
    loop {
        let state = changes.borrow_and_update().clone();
        if state.generation > q.since {
            // Read again: the change may be this device's own (its location), made after the
            // read above.
            let device = s.fleet.device(&peer.node_id).await?;
            let desired = state.for_node(&device.node_id, &device.labels, device.location.as_ref());
            return Ok(Json(desired).into_response());
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            // Timed out, or the service is shutting down.
            _ => return Ok(StatusCode::NOT_MODIFIED.into_response()),
        }
    }
}

pub async fn create_enrollment_token(
    State(s): State<AppState>,
    caller: Caller,
    Body(req): Body<CreateEnrollmentToken>,
) -> Result<Json<TokenCreated>> {
    Ok(Json(s.fleet.create_enrollment_token(&caller, req).await?))
}

pub async fn list_enrollment_tokens(
    State(s): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<EnrollmentTokenInfo>>> {
    Ok(Json(s.fleet.list_enrollment_tokens(&caller).await?))
}

pub async fn create_api_token(
    State(s): State<AppState>,
    caller: Caller,
    Body(req): Body<CreateApiToken>,
) -> Result<Json<TokenCreated>> {
    Ok(Json(s.fleet.create_api_token(&caller, req).await?))
}

pub async fn list_api_tokens(State(s): State<AppState>, caller: Caller) -> Result<Json<Vec<ApiTokenInfo>>> {
    Ok(Json(s.fleet.list_api_tokens(&caller).await?))
}

pub async fn revoke_api_token(State(s): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<StatusCode> {
    s.fleet.revoke_api_token(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn create_http_token(
    State(s): State<AppState>,
    caller: Caller,
    Body(req): Body<CreateHttpToken>,
) -> Result<Json<TokenCreated>> {
    Ok(Json(s.fleet.create_http_token(&caller, req).await?))
}

pub async fn list_http_tokens(State(s): State<AppState>, caller: Caller) -> Result<Json<Vec<HttpTokenInfo>>> {
    Ok(Json(s.fleet.list_http_tokens(&caller).await?))
}

pub async fn revoke_http_token(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Changed>> {
    Ok(Json(s.fleet.revoke_http_token(&caller, &id).await?))
}

pub async fn list_classes(State(s): State<AppState>, caller: Caller) -> Result<Json<Vec<ClassSpec>>> {
    Ok(Json(s.fleet.list_classes(&caller).await?))
}

pub async fn put_classes(
    State(s): State<AppState>,
    caller: Caller,
    Body(req): Body<PutClasses>,
) -> Result<Json<Changed>> {
    Ok(Json(s.fleet.put_classes(&caller, req).await?))
}

pub async fn remove_class(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Changed>> {
    Ok(Json(s.fleet.remove_class(&caller, &name).await?))
}

pub async fn list_node_configs(State(s): State<AppState>, caller: Caller) -> Result<Json<Vec<NodeConfigEntry>>> {
    Ok(Json(s.fleet.list_node_configs(&caller).await?))
}

pub async fn put_node_config(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Body(req): Body<PutNodeConfig>,
) -> Result<Json<Changed>> {
    Ok(Json(s.fleet.put_node_config(&caller, &name, req).await?))
}

pub async fn remove_node_config(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Changed>> {
    Ok(Json(s.fleet.remove_node_config(&caller, &name).await?))
}

pub async fn list_devices(State(s): State<AppState>, caller: Caller) -> Result<Json<Vec<DeviceInfo>>> {
    Ok(Json(s.fleet.list_devices(&caller).await?))
}

pub async fn set_device_location(
    State(s): State<AppState>,
    caller: Caller,
    Path(node_id): Path<String>,
    Body(req): Body<SetDeviceLocation>,
) -> Result<Json<Changed>> {
    Ok(Json(s.fleet.set_location(&caller, &node_id, req).await?))
}

pub async fn revoke_device(
    State(s): State<AppState>,
    caller: Caller,
    Path(node_id): Path<String>,
    Body(req): Body<RevokeDevice>,
) -> Result<Json<Changed>> {
    Ok(Json(s.fleet.revoke(&caller, &node_id, req).await?))
}

pub async fn audit(
    State(s): State<AppState>,
    caller: Caller,
    Query(q): Query<AuditQuery>,
) -> Result<Json<Vec<AuditEntry>>> {
    Ok(Json(s.fleet.audit_log(&caller, q).await?))
}

/// Module bytes as an answer.
fn wasm(bytes: Vec<u8>) -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/wasm")], bytes).into_response()
}

pub async fn upload_policy(
    State(s): State<AppState>,
    caller: Caller,
    Query(q): Query<UploadQuery>,
    ModuleBody(bytes): ModuleBody,
) -> Result<Json<Uploaded>> {
    Ok(Json(s.fleet.upload_policy(&caller, q, &bytes).await?))
}

pub async fn list_policies(State(s): State<AppState>, caller: Caller) -> Result<Json<Vec<PolicyVersionInfo>>> {
    Ok(Json(s.fleet.list_policies(&caller, None).await?))
}

pub async fn show_policy(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Vec<PolicyVersionInfo>>> {
    Ok(Json(s.fleet.list_policies(&caller, Some(&name)).await?))
}

pub async fn policy_module(
    State(s): State<AppState>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
) -> Result<Response> {
    Ok(wasm(s.fleet.policy_module(&caller, &name, &version).await?))
}

pub async fn node_module(State(s): State<AppState>, peer: PeerNode, Path(sha256): Path<String>) -> Result<Response> {
    Ok(wasm(s.fleet.node_module(&peer.node_id, &sha256).await?))
}

pub async fn start_rollout(
    State(s): State<AppState>,
    caller: Caller,
    Body(spec): Body<RolloutSpec>,
) -> Result<Json<RolloutStatus>> {
    Ok(Json(s.fleet.start_rollout(&caller, spec).await?))
}

pub async fn rollout_status(
    State(s): State<AppState>,
    caller: Caller,
    Path(policy): Path<String>,
) -> Result<Json<RolloutStatus>> {
    Ok(Json(s.fleet.rollout_status(&caller, &policy).await?))
}

pub async fn rollout_action(
    State(s): State<AppState>,
    caller: Caller,
    Path((policy, action)): Path<(String, String)>,
    Body(req): Body<RolloutAction>,
) -> Result<Json<RolloutStatus>> {
    Ok(Json(s.fleet.rollout_action(&caller, &policy, Action::parse(&action)?, req).await?))
}
