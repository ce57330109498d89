//! CUDA graphs: a run of launches recorded as a graph of kernel nodes, each after the one
//! before, instantiated once and replayed with one `cuGraphLaunch`, its nodes' grids and
//! arguments set anew where a step changed them (tallow-backend-gpu's `Replayed` decides
//! which runs are recorded and which launches are updated).

use std::ffi::c_void;

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUresult};
use tallow_backend::BackendError;
use tallow_backend_gpu::{Launch, Replay};

use crate::driver::{device_error, Driver};

/// A graph of kernel nodes and its executable form.
pub struct CudaGraph {
    /// Null until the graph is made.
    graph: sys::CUgraph,
    /// Null until the graph is instantiated.
    exec: sys::CUgraphExec,
    /// Each launch's node, in order.
    nodes: Vec<sys::CUgraphNode>,
}

// SAFETY: the driver's handles, usable from any thread; the backend uses a graph from one
// thread at a time (behind `Replayed`'s lock).
unsafe impl Send for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: made in `record` and destroyed once. An executable still running is freed
        // by the driver when it completes.
        unsafe {
            if !self.exec.is_null() {
                let _ = result::graph::exec_destroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}

fn graph_error(what: &str, code: CUresult) -> BackendError {
    BackendError::Device(format!("CUDA: {what}: {code:?}"))
}

/// `launch` as a kernel node's parameters, `params` pointing at its arguments' values.
fn node_params(
    function: sys::CUfunction,
    launch: &Launch,
    params: &mut [*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    let [grid_x, grid_y, grid_z] = launch.grid;
    let [block_x, block_y, block_z] = launch.block;
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: function,
        gridDimX: grid_x,
        gridDimY: grid_y,
        gridDimZ: grid_z,
        blockDimX: block_x,
        blockDimY: block_y,
        blockDimZ: block_z,
        sharedMemBytes: 0,
        kernelParams: params.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

impl Replay for Driver {
    type Graph = CudaGraph;

    fn record(&self, launches: &[Launch]) -> Result<CudaGraph, BackendError> {
        self.current()?;
        let mut graph = CudaGraph {
            graph: std::ptr::null_mut(),
            exec: std::ptr::null_mut(),
            nodes: Vec::with_capacity(launches.len()),
        };
        // SAFETY: writes the new graph's handle.
        let code = unsafe { sys::cuGraphCreate(&mut graph.graph, 0) };
        if code != CUresult::CUDA_SUCCESS {
            return Err(graph_error("cannot create a graph", code));
        }
        for launch in launches {
            let function = self.function(&launch.name)?;
            let previous = graph.nodes.last().copied();
            let mut node = std::ptr::null_mut();
            // SAFETY: a kernel of a loaded module with its arguments in order, each value
            // alive for the call (the driver copies them into the node); the node depends
            // on the one before it, of the same graph.
            let code = launch.args.with_params(|params| unsafe {
                let node_params = node_params(function, launch, params);
                let (dependencies, n) = match &previous {
                    Some(p) => (p as *const sys::CUgraphNode, 1),
                    None => (std::ptr::null(), 0),
                };
                sys::cuGraphAddKernelNode_v2(&mut node, graph.graph, dependencies, n, &node_params)
            });
            if code != CUresult::CUDA_SUCCESS {
                let what = format!("cannot add {} to a graph", launch.name);
                return Err(graph_error(&what, code));
            }
            graph.nodes.push(node);
        }
        // SAFETY: a graph of kernel nodes made above.
        graph.exec =
            unsafe { result::graph::instantiate(graph.graph, sys::CUgraphInstantiate_flags(0)) }
                .map_err(device_error)?;
        Ok(graph)
    }

    fn update(
        &self,
        graph: &mut CudaGraph,
        index: usize,
        launch: &Launch,
    ) -> Result<(), BackendError> {
        let Some(&node) = graph.nodes.get(index) else {
            return Err(BackendError::InvalidArgument(format!(
                "a graph of {} launches has no launch {index}",
                graph.nodes.len()
            )));
        };
        self.current()?;
        let function = self.function(&launch.name)?;
        // SAFETY: a node of the graph's executable, set to a launch of a loaded kernel with
        // its arguments in order (copied by the driver); launches of the executable already
        // made keep their old parameters.
        let code = launch.args.with_params(|params| unsafe {
            let node_params = node_params(function, launch, params);
            sys::cuGraphExecKernelNodeSetParams_v2(graph.exec, node, &node_params)
        });
        match code {
            CUresult::CUDA_SUCCESS => Ok(()),
            code => Err(graph_error(&format!("cannot update {}", launch.name), code)),
        }
    }

    fn replay(&self, graph: &CudaGraph) -> Result<(), BackendError> {
        self.current()?;
        // SAFETY: an instantiated graph, launched on the default stream in order with the
        // backend's other launches and copies.
        unsafe { result::graph::launch(graph.exec, std::ptr::null_mut()) }.map_err(device_error)
    }
}
