//! The token that guards every request: from the query once, then from
//! a cookie, compared in constant time.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::state::{Failure, Shared};

/// Equal without telling by its timing how much was equal.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn cookie_token(h: &HeaderMap) -> Option<&str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix("capsule_token="))
}

fn query_token(q: Option<&str>) -> Option<&str> {
    q?.split('&').find_map(|kv| kv.strip_prefix("t="))
}

/// Refuses what lacks the token or names another host; the page's first
/// load, with the token in the address, gets it as a cookie.
pub(crate) async fn guard(State(ui): State<Shared>, req: Request, next: Next) -> Response {
    let host_ok = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| {
            let port = ui.addr.port();
            h == ui.addr.to_string()
                || h == format!("localhost:{port}")
                || (ui.addr.ip().is_unspecified() && h.ends_with(&format!(":{port}")))
        });
    if !host_ok {
        return Failure(StatusCode::FORBIDDEN, "wrong host".into()).into_response();
    }
    let from_query = query_token(req.uri().query());
    let given = from_query
        .or_else(|| {
            req.headers()
                .get("x-capsule-token")
                .and_then(|v| v.to_str().ok())
        })
        .or_else(|| cookie_token(req.headers()));
    if !given.is_some_and(|t| same(t.as_bytes(), ui.token.as_bytes())) {
        return Failure(
            StatusCode::UNAUTHORIZED,
            "no token, or the wrong one: open the address `capsule ui` printed".into(),
        )
        .into_response();
    }
    let set_cookie = from_query.is_some();
    let mut resp = next.run(req).await;
    if set_cookie {
        if let Ok(v) = HeaderValue::from_str(&format!(
            "capsule_token={}; HttpOnly; SameSite=Strict; Path=/",
            ui.token
        )) {
            resp.headers_mut().insert(header::SET_COOKIE, v);
        }
    }
    resp
}
