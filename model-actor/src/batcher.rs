//! The batcher actor of one model version: owns the queue, forms batches with the
//! pure planner in `batching`, and keeps the runners busy with one batch ready
//! while another runs.
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, SpawnHandle, WrapFuture,
};

use crate::batching::{assemble, decide, triage, Decision, Drop, Policy, Waiting};
use crate::error::ModelError;
use crate::model::Batch;
use crate::runner::{Pending, RunBatch, Runner};

impl Message for Pending {
    type Result = ();
}

pub(crate) struct Batcher {
    queue: VecDeque<Pending>,
    runner: Addr<Runner>,
    policy: Policy,
    cols: usize,
    in_flight: usize,
    /// Runner instances + 1: every runner busy and one batch ready behind them.
    max_in_flight: usize,
    /// The armed wake-up, if any, and when it fires.
    timer: Option<(Instant, SpawnHandle)>,
    /// Smoothed forward-pass time, kept free before deadlines.
    compute_ewma: Duration,
    meters: std::sync::Arc<crate::stats::Meters>,
}

impl Batcher {
    pub fn new(
        runner: Addr<Runner>,
        policy: Policy,
        cols: usize,
        instances: usize,
        meters: std::sync::Arc<crate::stats::Meters>,
    ) -> Self {
        Self {
            queue: VecDeque::new(),
            runner,
            policy,
            cols,
            in_flight: 0,
            max_in_flight: instances + 1,
            timer: None,
            compute_ewma: policy.compute_reserve,
            meters,
        }
    }

    fn waiting(p: &Pending) -> Waiting {
        Waiting {
            rows: p.rows,
            enqueued_at: p.enqueued_at,
            deadline: p.deadline,
            cancelled: p.reply.is_closed(),
        }
    }

    /// Drops dead requests, then dispatches every batch the planner allows.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.queue.len() {
            match triage(&Self::waiting(&self.queue[i]), now) {
                None => i += 1,
                Some(why) => {
                    if let Some(p) = self.queue.remove(i) {
                        let reason = match why {
                            Drop::Expired => {
                                let _ = p.reply.send(Err(ModelError::DeadlineExceeded(
                                    "while waiting in the batch queue",
                                )));
                                "expired"
                            }
                            Drop::Cancelled => "cancelled",
                        };
                        match reason {
                            "expired" => self.meters.expired.increment(1),
                            _ => self.meters.cancelled.increment(1),
                        }
                    }
                }
            }
        }
        let policy = Policy {
            compute_reserve: self.compute_ewma,
            ..self.policy
        };
        while self.in_flight < self.max_in_flight {
            match decide(self.queue.iter().map(Self::waiting), now, &policy) {
                Decision::Idle => break,
                Decision::WaitUntil(at) => {
                    self.arm(at, ctx);
                    break;
                }
                Decision::Dispatch { count, rows } => {
                    let items: Vec<Pending> = self.queue.drain(..count).collect();
                    self.dispatch(items, rows, ctx);
                }
            }
        }
        self.meters.queue_length.set(self.queue.len() as f64);
    }

    fn arm(&mut self, at: Instant, ctx: &mut Context<Self>) {
        if let Some((when, handle)) = self.timer {
            if when <= at {
                return;
            }
            ctx.cancel_future(handle);
        }
        let handle = ctx.run_later(at.saturating_duration_since(Instant::now()), |act, ctx| {
            act.timer = None;
            act.pump(ctx);
        });
        self.timer = Some((at, handle));
    }

    fn dispatch(&mut self, items: Vec<Pending>, rows: usize, ctx: &mut Context<Self>) {
        let data = assemble(items.iter().map(|p| &p.data[..]), rows * self.cols);
        let msg = RunBatch {
            batch: Batch {
                rows,
                cols: self.cols,
                data,
            },
            items,
        };
        self.in_flight += 1;
        ctx.spawn(self.runner.send(msg).into_actor(self).map(|res, act, ctx| {
            act.in_flight -= 1;
            if let Ok(Some(took)) = res {
                // EWMA with weight 1/8 on the newest batch.
                act.compute_ewma = (act.compute_ewma * 7 + took) / 8;
            }
            act.pump(ctx);
        }));
    }
}

impl Actor for Batcher {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        self.meters.queue_length.set(0.0);
    }
}

impl Handler<Pending> for Batcher {
    type Result = ();

    fn handle(&mut self, p: Pending, ctx: &mut Self::Context) {
        self.queue.push_back(p);
        self.pump(ctx);
    }
}
