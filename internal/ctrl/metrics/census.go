package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/reflect/protoreflect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/enumlabel"
)

// censusTimeout bounds the store reads of one scrape.
const censusTimeout = 10 * time.Second

// The gauges of the census.
var (
	workspacesDesc = prometheus.NewDesc("kibotos_workspaces",
		"Live workspaces by state.", []string{"state"}, nil)
	guestConditionsDesc = prometheus.NewDesc("kibotos_workspace_guest_conditions",
		"Workspaces with a guest observation, by its condition.", []string{"condition"}, nil)
	memoryConditionsDesc = prometheus.NewDesc("kibotos_workspace_guest_memory_conditions",
		"Workspaces whose guest's memory condition is known, by it.", []string{"condition"}, nil)
	memoryKillsDesc = prometheus.NewDesc("kibotos_workspace_guest_memory_kills",
		"Sum of memory_kill_count over the guest observations: processes guests killed because memory stayed saturated, within the current executions.", nil, nil)
	guestRestartsDesc = prometheus.NewDesc("kibotos_workspace_guest_restarts",
		"Sum of restart_count over the guest observations: guests that reset and came back, within the current executions.", nil, nil)
	hostDescs = hostGauges{
		capacityCPU:    hostGauge("capacity_cpu_millis", "CPU the host offers, in thousandths of a core (its cores times the overcommit)."),
		capacityMemory: hostGauge("capacity_memory_bytes", "Memory the host offers."),
		capacityLayer:  hostGauge("capacity_layer_bytes", "Disk the host offers for writable layers."),
		reservedCPU:    hostGauge("reserved_cpu_millis", "CPU reserved on the host by the workspaces that want to run."),
		reservedMemory: hostGauge("reserved_memory_bytes", "Memory reserved on the host by the workspaces that want to run."),
		reservedLayer:  hostGauge("reserved_layer_bytes", "Disk reserved on the host by the writable layers of the workspaces placed there."),
	}
)

// hostGauges are the per-host gauges.
type hostGauges struct {
	capacityCPU, capacityMemory, capacityLayer *prometheus.Desc
	reservedCPU, reservedMemory, reservedLayer *prometheus.Desc
}

func hostGauge(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("kibotos_host_"+name, help, []string{"host"}, nil)
}

// census reads the store's census at every scrape.
type census func(context.Context) (workspaces.Census, error)

// RegisterCensus puts the census gauges on reg; each scrape calls read.
func RegisterCensus(reg prometheus.Registerer, read func(context.Context) (workspaces.Census, error)) error {
	return reg.Register(census(read))
}

// Describe implements prometheus.Collector.
func (census) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{workspacesDesc, guestConditionsDesc, memoryConditionsDesc, memoryKillsDesc, guestRestartsDesc,
		hostDescs.capacityCPU, hostDescs.capacityMemory, hostDescs.capacityLayer,
		hostDescs.reservedCPU, hostDescs.reservedMemory, hostDescs.reservedLayer} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A failed read serves none of
// the census.
func (read census) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), censusTimeout)
	defer cancel()
	c, err := read(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(workspacesDesc, err)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	// Every state a live workspace can have, zero included, so that a
	// series does not vanish when its last workspace leaves it.
	for _, n := range known(ctrlv1.WorkspaceState(0)) {
		if s := ctrlv1.WorkspaceState(n); s != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			gauge(workspacesDesc, float64(c.States[s]), enumlabel.Of(s))
		}
	}
	for _, n := range known(ctrlv1.GuestCondition(0)) {
		gauge(guestConditionsDesc, float64(c.GuestConditions[ctrlv1.GuestCondition(n)]), enumlabel.Of(ctrlv1.GuestCondition(n)))
	}
	for _, n := range known(ctrlv1.GuestMemoryCondition(0)) {
		gauge(memoryConditionsDesc, float64(c.MemoryConditions[ctrlv1.GuestMemoryCondition(n)]), enumlabel.Of(ctrlv1.GuestMemoryCondition(n)))
	}
	gauge(memoryKillsDesc, float64(c.MemoryKills))
	gauge(guestRestartsDesc, float64(c.GuestRestarts))
	for _, h := range c.Hosts {
		gauge(hostDescs.capacityCPU, float64(h.Capacity.CPUMillis), h.ID)
		gauge(hostDescs.capacityMemory, float64(h.Capacity.MemoryBytes), h.ID)
		gauge(hostDescs.capacityLayer, float64(h.Capacity.LayerBytes), h.ID)
		gauge(hostDescs.reservedCPU, float64(h.Reserved.CPUMillis), h.ID)
		gauge(hostDescs.reservedMemory, float64(h.Reserved.MemoryBytes), h.ID)
		gauge(hostDescs.reservedLayer, float64(h.Reserved.LayerBytes), h.ID)
	}
}

// known returns the numbers of e's enum but UNSPECIFIED.
func known(e protoreflect.Enum) []protoreflect.EnumNumber {
	return enumlabel.Known(e.Descriptor())
}
