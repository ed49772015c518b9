//! Process-wide counters of fabric events that are rare and not tied to a
//! logical unit, for a metrics exporter: logins the target refused (by the
//! RFC 7143 status it answered) and task management functions (by function
//! and response). Each is counted where the login phase refuses or the
//! task management response is built; neither is on the data path.

use std::collections::BTreeMap;
use std::sync::Mutex;

use blockwire_pdu::pdu::codes::{TmfFunction, TmfResponse};
use blockwire_pdu::LoginStatus;

static LOGIN_FAILURES: Mutex<BTreeMap<(u8, u8), u64>> = Mutex::new(BTreeMap::new());
static TASK_MANAGEMENT: Mutex<BTreeMap<(u8, u8), u64>> = Mutex::new(BTreeMap::new());

fn bump(map: &Mutex<BTreeMap<(u8, u8), u64>>, key: (u8, u8)) {
    *map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_insert(0) += 1;
}

/// The target refused a login with `status`.
pub fn login_failed(status: LoginStatus) {
    bump(&LOGIN_FAILURES, (status.class, status.detail));
}

/// Refused logins so far, by the status answered.
pub fn login_failures() -> Vec<(LoginStatus, u64)> {
    LOGIN_FAILURES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(&(c, d), &n)| (LoginStatus::new(c, d), n))
        .collect()
}

/// A task management function was answered with `response`.
pub fn task_management(function: TmfFunction, response: TmfResponse) {
    bump(&TASK_MANAGEMENT, (function.to_u8(), response.to_u8()));
}

/// Task management functions answered so far, by function and response.
pub fn task_management_counts() -> Vec<(TmfFunction, TmfResponse, u64)> {
    TASK_MANAGEMENT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(&(f, r), &n)| (TmfFunction::from_u8(f), TmfResponse::from_u8(r), n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_task_management_are_counted_by_their_codes() {
        // Codes no login or task management path answers with, so that
        // other tests running in this process cannot move these counts.
        let status = LoginStatus::new(3, 0x7f);
        let count = || {
            login_failures()
                .into_iter()
                .find(|(x, _)| *x == status)
                .map_or(0, |(_, n)| n)
        };
        assert_eq!(count(), 0);
        login_failed(status);
        login_failed(status);
        assert_eq!(count(), 2);

        let (function, response) = (TmfFunction::Other(0x7e), TmfResponse::Other(0x7d));
        let tmf = || {
            task_management_counts()
                .into_iter()
                .find(|(f, r, _)| *f == function && *r == response)
                .map_or(0, |(_, _, n)| n)
        };
        assert_eq!(tmf(), 0);
        task_management(function, response);
        assert_eq!(tmf(), 1);
    }
}
