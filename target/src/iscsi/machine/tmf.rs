//! Task management (RFC 7143 §11.5, SAM-5 task management functions).
//!
//! An abort marks the tasks in the session's task set; a task that had
//! already turned "completing" (its result queued or about to be) is let
//! finish, and the driver waits for it before the response leaves, so the
//! initiator never hears of a task after "Function complete" for it.

use blockwire_pdu::pdu::codes::{TmfFunction, TmfResponse};
use blockwire_pdu::pdu::{TaskMgmtRequest, TaskMgmtResponse};
use blockwire_pdu::{Bhs, Pdu};
use tracing::info;

use super::{Action, ConnMachine, EndReason};

impl ConnMachine {
    /// A Task Management Function Request the window delivered; false once
    /// the connection ends (TARGET COLD RESET).
    pub(super) fn task_management(&mut self, req: TaskMgmtRequest) -> bool {
        let lun = req.lun.index().unwrap_or(u16::MAX);
        let target = self.session.target.clone();
        let mut close_after = false;
        let mut settling = None;
        let response = match (&target, req.function) {
            (None, _) => TmfResponse::NotSupported,
            (Some(_), TmfFunction::AbortTask) => {
                // With one connection per session commands arrive in CmdSN
                // order, so a task that is not registered has completed (or
                // never existed): "task does not exist", as libiscsi expects.
                if self.abort_where(|itt, _| itt == req.referenced_task_tag) > 0 {
                    TmfResponse::FunctionComplete
                } else {
                    TmfResponse::TaskDoesNotExist
                }
            }
            (Some(t), TmfFunction::AbortTaskSet) => {
                if !t.luns.has_lun(lun) {
                    TmfResponse::LunDoesNotExist
                } else {
                    self.abort_where(|_, task_lun| task_lun == lun);
                    TmfResponse::FunctionComplete
                }
            }
            (Some(t), TmfFunction::ClearTaskSet) => {
                if !t.luns.has_lun(lun) {
                    TmfResponse::LunDoesNotExist
                } else {
                    // Every initiator's commands on the unit, not only
                    // this session's (SAM-5 7.4: one task set per unit).
                    let others = self.fabric.sessions.clear_task_set(t, lun, &self.session);
                    self.abort_where(|_, task_lun| task_lun == lun);
                    if !others.is_empty() {
                        self.out.push(Action::AwaitAborted {
                            aborted: Vec::new(),
                            completing: Vec::new(),
                            changing_medium: others,
                        });
                    }
                    TmfResponse::FunctionComplete
                }
            }
            (Some(t), TmfFunction::LogicalUnitReset) => {
                if !t.luns.has_lun(lun) {
                    TmfResponse::LunDoesNotExist
                } else {
                    self.abort_where(|_, task_lun| task_lun == lun);
                    self.fabric.sessions.abort_target_tasks(t, Some(lun));
                    if let Some(nexus) = &self.session.nexus {
                        settling = Some(t.luns.reset_lun(lun, nexus));
                    }
                    TmfResponse::FunctionComplete
                }
            }
            (Some(t), TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset) => {
                self.abort_where(|_, _| true);
                self.fabric.sessions.abort_target_tasks(t, None);
                if let Some(nexus) = &self.session.nexus {
                    settling = Some(t.luns.reset_target(nexus));
                }
                // A cold reset also drops the connections, "all of its TCP
                // connections to all initiators" (RFC 7143 §11.5.1): this
                // one after its answer, the other sessions of the target
                // now (their tasks were aborted above).
                close_after = req.function == TmfFunction::TargetColdReset;
                if close_after {
                    self.fabric.sessions.close_target_sessions(t, &self.session);
                }
                TmfResponse::FunctionComplete
            }
            (Some(_), TmfFunction::ClearAca) => TmfResponse::FunctionComplete,
            (Some(_), TmfFunction::TaskReassign) => TmfResponse::ReassignmentNotSupported,
            (Some(_), TmfFunction::Other(_)) => TmfResponse::NotSupported,
        };
        info!(
            tsih = self.session.tsih,
            function = req.function.name(),
            lun,
            response = response.name(),
            "task management"
        );
        crate::events::task_management(req.function, response);
        let answer = Pdu::new(Bhs::TaskMgmtResponse(TaskMgmtResponse {
            response,
            itt: req.itt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        }));
        // A reset's answer waits for the commands of every session still
        // running on the reset units (see `crate::scsi::Settling`): beside
        // this connection, which goes on reading (NOP-Outs, other LUNs'
        // commands), except for a cold reset, whose connection ends next.
        match settling.filter(|s| !s.is_empty()) {
            Some(s) if close_after => {
                self.out.push(Action::AwaitSettled(s));
                self.send(answer);
            }
            Some(s) => self.out.push(Action::SendWhenSettled(s, answer)),
            None => self.send(answer),
        }
        if close_after {
            self.out.push(Action::End(EndReason::ColdReset));
        }
        !close_after
    }

    /// Aborts this session's tasks `pick` selects (by ITT and LUN); returns
    /// how many were aborted. WRITEs still collecting data are dropped
    /// unrun; the driver waits for the rest before the next action.
    pub(super) fn abort_where(&mut self, pick: impl Fn(u32, u16) -> bool) -> usize {
        let outcome = self.session.tasks.abort_where(pick);
        self.drop_collectors(&outcome.aborted);
        let n = outcome.aborted.len();
        if !outcome.aborted.is_empty() || !outcome.completing.is_empty() {
            self.out.push(Action::AwaitAborted {
                aborted: outcome.aborted,
                completing: outcome.completing,
                changing_medium: outcome.changing_medium,
            });
        }
        n
    }
}
